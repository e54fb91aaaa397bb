#!/usr/bin/env bash
# Issue 50's two GPU checks in one device call (about 6 minutes on an H100):
#   1. the 340M paper config (experiments/configs/paper.py:kda_340m) at its recipe's 128 x 4096 tokens a step, run as
#      train.gradient_accumulation_steps = 32 microbatches of 4 x 4096: ms per step, tokens/s, peak memory
#      (`experiments.bench --what=train`, both timers, the default allocator);
#   2. benchmarks/eval/harness_vs_fla.py: our lm-evaluation-harness adapter against fla's HF model in the harness's
#      HFLM on the same local tasks.
# On the device: command "bash benchmarks/eval/issue50_gpu.sh", carry [".whl"] holding run_h200.sh's wheels and
# lm_eval 0.4.13 with the dependencies the image lacks (datasets, evaluate, dill, multiprocess, more_itertools,
# pytablewriter and its six, rouge_score, nltk, sqlitedict, word2number, chardet). Results in $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 HF_HOME=/tmp/hf_home
export TRITON_CACHE_DIR=/tmp/triton_cache
mkdir -p "$TRITON_CACHE_DIR"
[ -f benchmarks/fla_autotune_h100.tgz ] && tar xzf benchmarks/fla_autotune_h100.tgz -C "$TRITON_CACHE_DIR"
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" | tee "$OUT/log.txt"
timeout -k 10 "${BENCH_LIMIT:-220}" python3 -m experiments.bench --what=train \
  --set=configs=experiments/configs/paper.py:kda_340m --set=peers= --set=steps="${STEPS:-2}" --set=warmup=1 \
  --out_dir="$OUT" --tag=kda_340m_paper_batch 2>&1 | grep --line-buffered -v -i warning | tee -a "$OUT/log.txt"
timeout -k 10 "${HARNESS_LIMIT:-330}" python3 benchmarks/eval/harness_vs_fla.py --out "$OUT/harness" 2>&1 \
  | grep --line-buffered -v -i warning | tee -a "$OUT/log.txt"
(cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/fla_autotune.tgz" -T -)
rm -rf "$OUT/harness/corpus" "$OUT/harness/run/checkpoints" "$OUT/harness/fla/model.safetensors"
cat "$OUT"/*_kda_340m_paper_batch.md 2>/dev/null | tail -8
