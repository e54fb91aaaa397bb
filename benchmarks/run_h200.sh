#!/usr/bin/env bash
# The open GPU measurements in one device call, each step under its own time limit: modes of the benchmark
# registry (python3 -m experiments.bench --list), the numerics comparison (experiments.compare_impls) and MQAR
# training runs. Results go to /tmp/results; after every step they are packed into $OUT/results.tgz (the device tool
# brings back at most 8 files), beside $OUT/log.txt, so a step cut off by its limit keeps what it measured.
#
# Wheels the H200 image lacks (download here, never commit; carry ".whl"):
#   python3.12 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl grain==0.2.18 array-record portpicker ml-collections==1.1.0 fla-core==0.6.0
# Then, with the device tool: command "bash benchmarks/run_h200.sh [steps]", carry [".whl"]. Another setting is
# another command line: python3 -m experiments.bench --what=<mode> --set=<name>=<value> ... (--base=<commit> times
# a commit beside this tree in the same call).
# steps (default: compare bench sdm mqar):
#   bench       ops: pallas (chunk 32) and fla over DESIGN.md section 7's shapes, one process per mixer
#   baseline    ops: the pure-JAX chunk impl and fla at 4x4096, the table the kernels must beat
#   ops         ops: pallas and fla at 4x4096, kernel by kernel (CUPTI breakdown), in one process
#   kernels     each Pallas kernel alone at 4x4096, chunks 32 and 64, the state passes over block_v 16 / 32 / 64
#   compare     compare_impls: pallas against chunk, every gradient, every mixer, fp32 and bf16, at 4x4096
#   scan        compare_impls: every impl against scan at T 1200 (not a whole number of chunks)
#   ncu         Nsight Compute on the per-chunk kernels of one GDN-2 op (benchmarks/ncu_target.py)
#   sdm         sdm: the SDM op beside dense GDN, its row traffic, product-key addressing
#   sdm_ncu     Nsight Compute on the SDM token kernels (benchmarks/ncu_target.py), their SASS with stall samples
#   sdm_tests   the SDM tests (packed included) on the GPU, the token kernels compiled by Triton
#   sdm_kernels sdm: the SDM pallas op kernel by kernel (CUPTI breakdown)
#   sdm_memory  sdm_memory: the SDM op's options (saved rows, table dtype): memory, time, accuracy
#   sdm_launch  sdm_memory: the SDM op's forward+backward over the token kernels' launch settings, fp32 and bf16 table
#   packed      packed: what packing 8 documents per row costs KDA, GDN, GDN-2 (chunk 32) and the SDM op, kernel by kernel
#   decode      decode: every mixer's model and full attention, batch 1 and 32, contexts 1K to 64K
#   train       train: the KDA reference model against fla's KDA, one process each
#   packed_step the corpus run's GDN-2 340M step packed (8 documents a row) against unpacked, with each step's kernels
#   sdm_train   train: the SDM hybrid (fp32 table, bf16 table, bf16 table and gradient) against the dense GDN model
#   sdm_table   the SDM hybrid trained on the stdlib corpus (carry data/stdlib32k) with those table dtypes
#   corpus      issue 23's show: GDN-2 at the 340M shape, packed documents, on the stdlib corpus (resumable)
#   corpus_nopack  the same program with packing off, for its tokens/s (CORPUS_NOPACK_STEPS, default 200)
#   mqar        the default MQAR trained with every dense mixer
#   mqar_small  a smaller MQAR (vocab 256, 8 pairs, 64 tokens) trained long enough to show recall is learned
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
# The default allocator: no XLA_PYTHON_CLIENT_PREALLOCATE=false, which distorts back-to-back times (DESIGN.md
# section 7); the ops mode, which shares the card with torch, lowers XLA_PYTHON_CLIENT_MEM_FRACTION itself.
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
# The card that ran (the device tool may lend an H100 for an H200): first line of the log.
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" | tee -a "$OUT/log.txt"
run() {  # run LIMIT_SECONDS COMMAND...: output to the terminal and to $OUT/log.txt
  local limit=$1; shift
  echo "== $* (limit ${limit}s)" | tee -a "$OUT/log.txt"
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v -i "warning" | tee -a "$OUT/log.txt"
  tar czf "$OUT/results.tgz" -C "$RES" --exclude=checkpoints .
  (cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/fla_autotune.tgz" -T -)
}
bench() {  # bench LIMIT MODE TAG ARGS...: one mode of the registry, its report in $RES/<date>_TAG.*
  local limit=$1 mode=$2 tag=$3; shift 3
  run "$limit" python3 -m experiments.bench --what="$mode" --out_dir="$RES" --tag="$tag" "$@"
}
# Issue 23's show: GDN-2 at the 340M shape on the stdlib corpus (carry data/stdlib32k)
CORPUS_CONFIG=experiments/configs/paper.py:gdn2_340m,data/stdlib32k
corpus_train() {  # corpus_train LIMIT WORKDIR ARGS...: the show's training program (4 rows a step, lr 6e-4), ARGS added
  local limit=$1 workdir=$2; shift 2
  run "$limit" python3 -m experiments.train --config="$CORPUS_CONFIG" --workdir="$workdir" \
    --config.data.batch_size=4 --config.train.warmup_steps=200 --config.train.learning_rate=6e-4 \
    --config.train.log_every=50 "$@"
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
compare_runs() {  # compare_runs NAME LIMIT IMPLS "DTYPES" ARGS...: compare_impls for every dense mixer and dtype
  local name=$1 limit=$2 impls=$3 dtypes=$4; shift 4
  for dt in $dtypes; do
    for m in gdn2 kda gdn fg2_gdn fg2_gdn_plus; do
      run "$limit" python3 -m experiments.compare_impls --mixer=$m --impls=$impls --heads=16 --head_dim=128 --dtype=$dt \
        --out_json="$RES/${name}_${m}_$dt.json" "$@"
    done
  done
}
for step in ${*:-compare bench sdm mqar}; do
  case $step in
    bench)  # one process per mixer so fla autotunes once per mixer (its first shape took over 200 s in session 3);
      # the report is rewritten after every shape
      for m in gdn2 kda; do
        bench 560 ops h200_bench_${m}_c32 --mixers=$m --impls=pallas --shapes=4x4096,8x2048,2x8192,1x16384,1x32768 \
          --set=chunk_size=32 --reps=10
      done ;;
    baseline)
      for m in kda gdn2; do
        bench 280 ops h200_chunk_baseline_$m --mixers=$m --impls=chunk --shapes=4x4096 --reps=10
      done ;;
    ops)
      bench 300 ops h200_ops_kernels --mixers=gdn2,kda --impls=pallas --shapes=4x4096 --set=chunk_size=32 \
        --set=breakdown=true --reps=10 ;;
    kernels)
      bench 400 kernels h200_kernels --set=chunk_sizes=32,64 --set=grid.state_pass.block_v=16,32,64 \
        --set=grid.state_pass_bwd.block_v=16,32,64 ;;
    compare)
      compare_runs compare 150 chunk,pallas "bfloat16 float32" --batch=4 --seq_len=4096 ;;
    scan)
      compare_runs scan 100 scan,chunk,pallas "float32 bfloat16" --batch=2 --seq_len=1200 ;;
    ncu)  # Nsight Compute on the per-chunk kernels of one GDN-2 op (chunk 64): forward, then forward and backward
      NCU=/usr/local/cuda/bin/ncu
      run 160 timeout -s KILL 150 "$NCU" -k regex:"gram_solve|solved|intra_chunk|pair_bwd" -c 4 --section LaunchStats \
        --section Occupancy --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
        python3 benchmarks/ncu_target.py gdn2 64 ;;
    sdm_ncu)  # Nsight Compute on the SDM token kernels (forward, then forward and backward): where each token waits;
      # both ncu steps profile benchmarks/ncu_target.py (it says why), killed if they hang
      NCU=/usr/local/cuda/bin/ncu
      run 240 timeout -s KILL 230 "$NCU" -k regex:sparse_tokens -c 3 --section LaunchStats --section Occupancy \
        --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section SourceCounters \
        -o "$RES/sdm_ncu" python3 benchmarks/ncu_target.py sdm
      [ -f "$RES/sdm_ncu.ncu-rep" ] && "$NCU" -i "$RES/sdm_ncu.ncu-rep" --page source --csv --print-source sass \
        > "$RES/sdm_ncu_sass.csv" 2>&1 ;;
    sdm_tests)  # the SDM tests on the GPU: the Pallas token kernels (packed included) against the float64 scan
      run 300 python3 -m pytest -q -p no:cacheprovider tests/ops/test_sparse_packed.py tests/ops/test_sparse_delta.py \
        tests/pallas_kernels/test_sparse_delta_kernel.py ;;
    sdm)
      bench 500 sdm h200_sdm ;;
    sdm_kernels)
      bench 200 sdm h200_sdm_kernels --impls=pallas --set=breakdown=true ;;
    sdm_memory)
      bench 400 sdm_memory h200_sdm_memory ;;
    sdm_launch)  # the token kernels' launch (forward/backward block_v x num_warps) with each table dtype; SDM_TABLES,
      # SDM_LAUNCHES narrow the sweep, SDM_BASE=<commit> times that tree beside this one
      entries=()
      for table in ${SDM_TABLES:-float32 bfloat16}; do
        for launch in ${SDM_LAUNCHES:-64x8/64x8 64x4/64x4 64x16/64x16 32x4/32x4 32x8/32x8 128x8/128x8 128x16/128x16 16x4/16x4}; do
          entries+=("pallas:float32:1:$table@$launch")
        done
      done
      bench 560 sdm_memory h200_sdm_launch --set=entries="$(IFS=,; echo "${entries[*]}")" ${SDM_BASE:+--base=$SDM_BASE} ;;
    packed)
      bench 400 packed h200_packed --set=chunk_sizes=32 --set=breakdown=true ;;
    decode)
      bench 500 decode h200_decode ;;
    train)  # one entry and its peer per call: each process compiles for a minute, fla autotunes for minutes
      bench 560 train h200_train_kda --set=configs=experiments/configs/paper.py:kda_ref --set=peers=kda ;;
    packed_step)  # the corpus run's model and shape, one step packed (8 documents a row) against unpacked, with the
      # kernels of each step by device time (where packing's 1.11x of the step goes); random tokens of the corpus's
      # vocabulary (32,000, as paper.py's), so no data is carried (--set=configs is a comma list: no data dir there)
      bench 400 train packed_step --set=configs="${CORPUS_CONFIG%%,*}" --set=batch=4 --set=docs=0,8 --set=peers= ;;
    sdm_train)
      bench 300 train h200_train_sdm_vs_gdn --set=configs=experiments/configs/paper.py:gdn_ref,experiments/configs/paper.py:sdm_ref \
        --set=peers=
      bench 200 train h200_train_sdm_bf16table --set=configs=experiments/configs/paper.py:sdm_ref \
        --set=overrides=model.sdm.table_dtype=bfloat16 --set=peers=
      bench 200 train h200_train_sdm_bf16grad --set=configs=experiments/configs/paper.py:sdm_ref \
        --set=overrides=model.sdm.table_dtype=bfloat16,model.sdm.table_grad_dtype=bfloat16 --set=peers= ;;
    sdm_table)  # the same run, seed and batches with each table dtype (table:gradient; SDM_TABLE_RUNS narrows them):
      # the cost in loss of the bf16 table and of its bf16 gradient
      workdirs=()
      for dts in ${SDM_TABLE_RUNS:-float32:float32 bfloat16:float32 bfloat16:bfloat16}; do
        dt=${dts%:*} gdt=${dts#*:}
        workdirs+=("$RES/sdm_table_${dt}_$gdt")
        run 230 python3 -m experiments.train --config=experiments/configs/paper.py:sdm_ref,data/stdlib32k \
          --workdir="$RES/sdm_table_${dt}_$gdt" --config.model.sdm.table_dtype=$dt \
          --config.model.sdm.table_grad_dtype=$gdt --config.train.steps=${SDM_TABLE_STEPS:-400} \
          --config.train.warmup_steps=100 --config.train.eval_every=100 --config.train.checkpoint_every=100000 \
          --config.train.log_every=10
      done
      run 30 python3 -m experiments.summarize_runs --workdirs="$(IFS=,; echo "${workdirs[*]}")" \
        --out="$RES/sdm_table_summary" ;;
    corpus)  # issue 23's show (corpus_train), documents packed,
      # CORPUS_STEPS (default 3000) steps; SIGTERM at the limit checkpoints at a step boundary, and the same call on
      # the warm machine resumes it (the workdir is under runs/, kept between calls); metrics and log in $RES
      corpus_train "${CORPUS_LIMIT:-540}" runs/corpus_gdn2_340m --config.train.steps="${CORPUS_STEPS:-3000}" \
        --config.train.eval_every=500 --config.train.checkpoint_every=250
      mkdir -p "$RES/corpus_gdn2_340m"
      cp runs/corpus_gdn2_340m/*.json* runs/corpus_gdn2_340m/*.png "$RES/corpus_gdn2_340m/" 2>/dev/null
      tar czf "$OUT/results.tgz" -C "$RES" --exclude=checkpoints . ;;
    corpus_nopack)  # the same run's program with packing off (the same rows, one sequence each): its tokens/s over
      # CORPUS_NOPACK_STEPS (default 200) steps, from scratch, no evaluation before the last step
      corpus_train 300 "$RES/corpus_gdn2_340m_nopack" --config.data.document_masks=False \
        --config.train.steps="${CORPUS_NOPACK_STEPS:-200}" --config.train.eval_every=100000 \
        --config.train.checkpoint_every=100000 ;;
    mqar)
      mqar_runs mqar 62 "gdn kda fg2_gdn fg2_gdn_plus gdn2" \
        --config.train.steps=1500 --config.train.eval_every=250 --config.train.checkpoint_every=1500 ;;
    mqar_small)
      mqar_runs mqar_small 110 "gdn2 kda" \
        --config.data.vocab_size=256 --config.data.seq_len=64 --config.data.num_kv_pairs=8 \
        --config.data.num_queries=8 --config.data.batch_size=64 --config.train.warmup_steps=200 \
        --config.train.steps=4000 --config.train.eval_every=1000 --config.train.checkpoint_every=4000 \
        --config.train.log_every=100 ;;
    *) echo "unknown step $step" | tee -a "$OUT/log.txt" ;;
  esac
done
