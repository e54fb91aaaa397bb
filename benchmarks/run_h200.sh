#!/usr/bin/env bash
# The open GPU measurements in one device call, each step under its own time limit. Results go to
# /tmp/results; after every step they are packed into $OUT/results.tgz (the device tool brings back
# at most 8 files), beside $OUT/log.txt, so a step cut off by its limit keeps what it measured.
#
# Wheels the H200 image lacks (download here, never commit; carry ".whl"):
#   python3.12 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl grain==0.2.18 array-record portpicker ml-collections==1.1.0 fla-core==0.6.0
# Then, with the device tool: command "bash benchmarks/run_h200.sh [steps]", carry [".whl"].
# steps: any of probe forward prep ops scan ncu baseline kernels bench sdm sdm_probe train mqar_small (default: kernels bench sdm
# train).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
# The default allocator: no XLA_PYTHON_CLIENT_PREALLOCATE=false, which distorts back-to-back times (DESIGN.md
# section 7); bench_ops, which shares the card with torch, lowers XLA_PYTHON_CLIENT_MEM_FRACTION itself.
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
# fla's autotuning (285 s for gdn2's first shape in session 11) is kept between calls and sessions: Triton
# caches each result as a small *.autotune.json; the call leaves them in $OUT/fla_autotune.tgz. Copy that
# file over benchmarks/fla_autotune_h200.tgz (committed, ~16 KB) when it has grown: fla then compiles only
# the config its own autotuning picked on this device type, with the same triton and fla.
export TRITON_CACHE_DIR=/tmp/triton_cache
mkdir -p "$TRITON_CACHE_DIR"
[ -f benchmarks/fla_autotune_h200.tgz ] && tar xzf benchmarks/fla_autotune_h200.tgz -C "$TRITON_CACHE_DIR"
OUT=${OUT:-/tmp/out}
RES=/tmp/results
mkdir -p "$OUT" "$RES"
run() {  # run LIMIT_SECONDS COMMAND...: output to the terminal and to $OUT/log.txt
  local limit=$1; shift
  echo "== $* (limit ${limit}s)" | tee -a "$OUT/log.txt"
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v -i "warning" | tee -a "$OUT/log.txt"
  tar czf "$OUT/results.tgz" -C "$RES" --exclude=checkpoints .
  (cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/fla_autotune.tgz" -T -)
}
mqar_runs() {  # mqar_runs NAME LIMIT "VARIANTS" OVERRIDES...: pallas MQAR runs (2 layers, width 256), then a summary
  local name=$1 limit=$2 variants=$3 workdirs=(); shift 3
  for v in $variants; do
    workdirs+=("$RES/${name}_$v")
    run "$limit" python3 -m experiments.train --config=experiments/configs/mqar.py:$v --workdir="$RES/${name}_$v" \
      --config.model.impl=pallas --config.model.width=256 --config.model.num_heads=4 "$@"
  done
  run 30 python3 -m experiments.summarize_runs --workdirs="$(IFS=,; echo "${workdirs[*]}")" --out="$RES/${name}_summary"
}
compare_runs() {  # compare_runs NAME LIMIT IMPLS "DTYPES" ARGS...: compare_impls for every mixer (KERNEL_MIXERS) and dtype
  local name=$1 limit=$2 impls=$3 dtypes=$4; shift 4
  for dt in ${KERNEL_DTYPES:-$dtypes}; do
    for m in ${KERNEL_MIXERS:-gdn2 kda gdn fg2_gdn fg2_gdn_plus}; do
      run "$limit" python3 -m experiments.compare_impls --mixer=$m --impls=$impls --heads=16 --head_dim=128 --dtype=$dt \
        --out_json="$RES/${name}_${m}_$dt.json" "$@"
    done
  done
}
steps=${*:-kernels bench sdm train}
for step in $steps; do
  case $step in
    baseline)  # the pure-JAX chunk impl next to fla, the table the kernels must beat (KDA, then GDN-2)
      for m in ${BASELINE_MIXERS:-kda gdn2}; do
        run 280 python3 -m experiments.bench_ops --mixers=$m --impls=chunk --shapes=4x4096 --reps=10 \
          --out_dir="$RES" --tag=h200_chunk_baseline_$m
      done ;;
    probe)  # each Pallas kernel alone, over key-block sizes, and the op's gradients against the chunk impl
      run ${PROBE_LIMIT:-400} env CHUNKS=${CHUNKS:-64} FWD=${FWD:-32:4:64:4} BWD=${BWD:-32:4:32:4} STATE_BLOCKS=${STATE_BLOCKS:-32} STATE_STAGES=${STATE_STAGES:-auto} python3 benchmarks/scripts/probe_kernels.py ${PROBE_SHAPE:-4,4096,16} ;;
    ops)  # our op and fla's, kernel by kernel, in one process (probe_ops.py)
      run ${OPS_LIMIT:-300} env OPS_CHUNK=${OPS_CHUNK:-64} python3 benchmarks/scripts/probe_ops.py ${OPS_MIXERS:-gdn2,kda} ${OPS_SHAPE:-4x4096} ;;
    forward)  # the forward's state pass over launch settings and gram_solve with parts taken out (probe_forward.py)
      run ${FORWARD_LIMIT:-300} python3 benchmarks/scripts/probe_forward.py ${FORWARD_SHAPES:-2,8192,16 1,16384,16 4,4096,16} ;;
    prep)  # the launches in front of the chunk kernels (mixer_inputs, chunk_cumsum) alone, over launch settings
      run ${PREP_LIMIT:-200} python3 benchmarks/scripts/probe_prep.py ${PROBE_SHAPE:-4,4096,16} ;;
    scan)  # every impl against scan on the GPU at a shorter T that is not a whole number of chunks (19 of 64)
      compare_runs scan ${SCAN_LIMIT:-100} scan,chunk,pallas "float32 bfloat16" --batch=2 --seq_len=${SCAN_T:-1200} ;;
    ncu)  # Nsight Compute on the per-chunk kernels, where the image has it and allows counters
      if command -v ncu >/dev/null || [ -x /usr/local/cuda/bin/ncu ]; then
        NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        run ${NCU_LIMIT:-150} "$NCU" --target-processes all -k regex:"gram_solve|solved|intra_chunk|pair_bwd" -c 4 --section LaunchStats \
          --section Occupancy --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
          python3 benchmarks/scripts/one_intra_chunk.py 64
      else
        echo "no ncu on this machine: $(ls /usr/local/cuda/bin 2>/dev/null | tr '\n' ' ')" | tee -a "$OUT/log.txt"
      fi ;;
    kernels)  # pallas vs chunk, every gradient, at the issue shape, every mixer in fp32 and bf16
      compare_runs compare ${KERNEL_LIMIT:-150} chunk,pallas "bfloat16 float32" --batch=4 --seq_len=4096 ;;
    bench)  # pallas and fla over DESIGN.md section 7's shapes, one process per mixer so fla autotunes once per
      # mixer (its first shape took over 200 s in session 3); the report is rewritten after every shape
      for m in ${BENCH_MIXERS:-gdn2 kda}; do
        run ${BENCH_LIMIT:-560} python3 -m experiments.bench_ops --mixers=$m --impls=${BENCH_IMPLS:-pallas} \
          --shapes=${BENCH_SHAPES:-4x4096,8x2048,2x8192,1x16384,1x32768} --chunk_size=${BENCH_CHUNK:-64} --reps=10 --out_dir="$RES" --tag=h200_bench_${m}_c${BENCH_CHUNK:-64}
      done ;;
    mqar_small)  # a smaller MQAR (vocab 256, 8 pairs, 64 tokens) trained long enough to show recall is learned
      mqar_runs mqar_small 110 "${MQAR_SMALL_VARIANTS:-gdn2 kda}" \
        --config.data.vocab_size=256 --config.data.seq_len=64 --config.data.num_kv_pairs=8 \
        --config.data.num_queries=8 --config.data.batch_size=64 --config.train.warmup_steps=200 \
        --config.train.steps=4000 --config.train.eval_every=1000 --config.train.checkpoint_every=4000 \
        --config.train.log_every=100 ;;
    sdm)
      run ${SDM_LIMIT:-500} python3 -m experiments.bench_sdm --impls=${SDM_IMPLS:-chunk,pallas} \
        --sdm_chunk_sizes=${SDM_CHUNKS:-16} --out_dir="$RES" --tag=h200_sdm ;;
    sdm_probe)  # the SDM pallas op kernel by kernel, and its token kernels over launch settings
      run ${SDM_PROBE_LIMIT:-200} env SDM_FWD=${SDM_FWD:-32:4:1,32:2:1,64:4:1} SDM_BWD=${SDM_BWD:-32:8:1,64:8:1} \
        python3 benchmarks/scripts/probe_sdm_kernels.py ${SDM_BT:-4,4096} ;;
    train)  # the default MQAR, every dense mixer
      mqar_runs mqar 62 "gdn kda fg2_gdn fg2_gdn_plus gdn2" \
        --config.train.steps=1500 --config.train.eval_every=250 --config.train.checkpoint_every=1500 ;;
  esac
done
