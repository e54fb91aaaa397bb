#!/usr/bin/env bash
# Issue 49's probe in one device call of at most 8 minutes: the Pallas ops of KDA, GDN-2 and GDN (one decay per head),
# forward and forward+backward, at chunk 32, 64 and 16 over DESIGN.md section 7's shapes (bf16, H 16, K = V = 128),
# with fla 0.6.0's chunk_kda and chunk_gdn2 in the same process, plain and with safe_gate=True, lower_bound=-5 (every
# input set's g, ours too, clipped at -5 so that both compute the same); both clocks (CUPTI kernel sums and the host
# clock around back-to-back calls). One run of `experiments.bench --what=ops`: shape by shape, every mixer at each, the
# programs of a mixer and shape compiled at once, the report rewritten after each, so a run cut off by the limit keeps
# every mixer at the shapes it reached. Full results in $OUT (<date>_issue49_probe.{json,md,png}, log.txt, fla's
# autotune cache fla_autotune.tgz); the summary table (each chunk size and fla mode, our fastest over fla's fastest)
# is printed last.
#
# On the device (the wheels of run_h200.sh's header in .whl):  command "bash benchmarks/issue49_probe.sh",
# carry [".whl"]. Knobs: SHAPES, CHUNKS, MIXERS, PEER_MODES (comma lists), LIMIT (seconds, default 430).
# On a CPU, DRY_RUN=1 bash benchmarks/issue49_probe.sh runs the same command at a tiny shape in interpret mode (no
# wheels, no fla: a check that the script and the mode parse and run), into $OUT (default /tmp/issue49_dry).
set -u
if [ -n "${DRY_RUN:-}" ]; then
  PYTHON=${PYTHON:-.venv/bin/python}
  OUT=${OUT:-/tmp/issue49_dry}
  SHAPES=${SHAPES:-1x64} HEADS=1 HEAD_DIM=16 THREADS=2 REPS=2
  export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/issue49_dry_triton}
else
  PYTHON=python3
  OUT=${OUT:-/tmp/out}
  SHAPES=${SHAPES:-4x4096,8x2048,2x8192,1x16384,1x32768} HEADS=16 HEAD_DIM=128 THREADS=6 REPS=10
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:.
  # fla's autotuning results for these shapes (benchmarks/README.md), so that it does not autotune again.
  export TRITON_CACHE_DIR=/tmp/triton_cache
fi
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$TRITON_CACHE_DIR"
[ -f benchmarks/fla_autotune_h200.tgz ] && tar xzf benchmarks/fla_autotune_h200.tgz -C "$TRITON_CACHE_DIR"
# The card that ran (an H100 may come for an H200): first line of the log.
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" | tee "$OUT/log.txt"
command=("$PYTHON" -m experiments.bench --what=ops --mixers="${MIXERS:-kda,gdn2,gdn}" --impls=pallas
         --shapes="$SHAPES" --reps="$REPS" --set=chunk_size="${CHUNKS:-32,64,16}"
         --set=peer_modes="${PEER_MODES:-plain,safe_gate}" --set=compile_threads="$THREADS" --set=heads="$HEADS"
         --set=head_dim="$HEAD_DIM" --set=dtype=bfloat16 --out_dir="$OUT" --tag=issue49_probe)
echo "== ${command[*]} (limit ${LIMIT:-430}s)" | tee -a "$OUT/log.txt"
timeout -k 10 "${LIMIT:-430}" "${command[@]}" 2>&1 | grep --line-buffered -v -i "warning" | tee -a "$OUT/log.txt"
status=${PIPESTATUS[0]}
(cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/fla_autotune.tgz" -T -)
report=$(ls -t "$OUT"/*_issue49_probe.md 2>/dev/null | head -1)
if [ -z "$report" ]; then
  echo "error: no report in $OUT (exit status $status); the log is $OUT/log.txt" >&2
  exit 1
fi
# Exit status 124: the limit cut the run (the report holds the shapes reached); 3: some entries failed (each error is
# in the report).
echo "== exit status $status; report $report" | tee -a "$OUT/log.txt"
sed -n '/^## Each chunk size and peer mode/,$p' "$report"
