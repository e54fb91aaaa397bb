#!/usr/bin/env bash
# The earlier protocol's script, kept for the records it made (benchmarks/recall/README.md, history): the study now
# runs by benchmarks/recall/protocol.sh. recall.py's variants carry the new protocol (a stop at accuracy 0.99, up to
# 4,000 / 6,000 steps, SDM at W = R = 64), so these steps no longer rerun the earlier runs as they were; each of those
# runs' run_config.json holds the config it trained with.
# Issue 24's recall study on one H200, one step per device call (each under 9 minutes). Every step is a sweep
# (experiments/sweep.py) into runs/recall/<step>, run in one process (--in_process: these models are small, so a
# process's start-up and compilation would cost more than its training), under its own time limit: a step cut
# short keeps its finished runs, and the same call again (on the same warm machine) resumes where it stopped.
# After every step the summaries and each run's metrics, evaluations and configs (no checkpoints) are packed
# into $OUT/recall.tgz, beside $OUT/log.txt.
#
# Wheels the H200 image lacks: see benchmarks/run_h200.sh (carry ".whl").
# With the device tool: command "bash benchmarks/recall/run_h200.sh <step>", carry [".whl"].
# steps: default  the default MQAR config learned (mqar.py:gdn2 at lr 1e-2 and 3e-3, its default), 1 seed
#        state    MQAR accuracy against the recurrent state, every mixer at WIDTHS (default 128; "64 128 256"),
#                 SEEDS seeds from FIRST_SEED (default 1 from 0: a later call with FIRST_SEED=1 SEEDS=2 adds two), into
#                 runs/recall/$STATE_DIR (default state); LRS='1e-3|1e-2' adds a learning-rate axis (Zoology tunes it
#                 per model: whether a model that stays on the loss plateau at width 256 is short of steps or of rate)
#        niah     NIAH_TASKS (default s_niah_1 mk_niah_1; any of s_niah_1-3, mk_niah_1-3), trained 3000 steps at 1024
#                 bytes and evaluated at 1K-8K, NIAH_MIXERS at width 128 (default gdn2 sdm swa attention), into
#                 runs/recall/$NIAH_DIR (default niah); NIAH_VARIANTS='v1|v2|...' (recall.py's variants) replaces the
#                 tasks x mixers list (the missing seeds of some rows); STEP_LIMIT (default 530 s) bounds the step,
#                 to fit the device time left (a cut-off run resumes from its last checkpoint on the same machine)
#        seqlen   MQAR at sequence lengths other than 128: MIXERS x SEQ_POINTS ('seq_len,pairs,queries|...', default
#                 64, 256 and 512 with seq_len / 8 pairs) at width 128, into runs/recall/$SEQ_DIR (default seqlen)
#        twins    the same run four times at once, twice with DETERMINISTIC's flag: do twins repeat, at what cost
#        summary  the summaries of runs/recall/state and runs/recall/niah again (e.g. after an interrupted step)
# Finished runs to skip: copy a step's directory (as brought back in recall.tgz, without checkpoints) to
# runs/carried/recall/<dir> here and carry ["runs/carried"]: the script merges it into runs/recall/<dir> without
# replacing anything the machine already has, so the step trains only the rest, on a fresh machine or a warm one.
# (Carrying runs/recall/<dir> itself would replace the machine's copy: on a warm machine the cut runs' checkpoints and
# the previous call's finished runs are lost, and those runs train again from step 0; session 28 lost a call so.)
# MIXERS (default: all eight) narrows the state and seqlen steps. PARALLEL=n (default 3) runs every step as n processes sharing
# the GPU, each a shard of the sweep's runs (experiments.sweep --shard), then one summary of them all: 3 processes
# trained NIAH runs at 1.4x the rate of one (session 18, benchmarks/recall/README.md); 5 on an H100 ran eight 3,000-step
# NIAH-2 runs (two to a shard; the fifth shard had crashed) in 291 s, 82-170 s each (session 25); 8 were slower in all
# than 4-5 (about 70 against 80-100 training steps a second, session 26): use 5-6. CARD_SHARES=m:
# several of these scripts at once, each with its own OUT, m processes in all (each gets 0.9 / m of the card's
# memory); wait for them with `wait`, not `pgrep -f`, which matches the device command's own line.
# DETERMINISTIC (default 1; 0 turns it off): XLA's deterministic GPU ops (below).
set -u
# (installed once per machine: several of these scripts may run at once, CARD_SHARES below)
[ -d /tmp/site/grain ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
# XLA's deterministic GPU algorithms (scatter-adds without atomics), on unless DETERMINISTIC=0. Without it the same seed
# run in two calls has given different results (S-NIAH-2 GDN seed 2: 0.089 and 0.225, session 25); whether this flag
# makes the runs bit-reproducible, and what it costs, is what the twins step and protocol.sh's sanity piece measure.
if [ "${DETERMINISTIC:-1}" != 0 ]; then export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_deterministic_ops=true"; fi
OUT=${OUT:-/tmp/out}
RES=runs/recall
mkdir -p "$OUT" "$RES"
[ -d runs/carried/recall ] && cp -rn runs/carried/recall/. "$RES"/  # the carried finished runs (above)
# The card that ran (the device tool may lend an H100 for an H200): first line of the log.
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" | tee -a "$OUT/log.txt"
SEEDS=${SEEDS:-1}
WIDTHS=${WIDTHS:-128}
FIRST_SEED=${FIRST_SEED:-0}
card_fraction() {  # card_fraction N: each of N processes sharing the card gets 0.9 / N of its memory
  python3 -c "print(round(0.9 / $1, 3))"
}
run() {  # run LIMIT_SECONDS COMMAND...: output to the terminal and to $OUT/log.txt, then pack the results
  local limit=$1; shift
  echo "== $* (limit ${limit}s)" | tee -a "$OUT/log.txt"
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v -i "warning" | tee -a "$OUT/log.txt"
  tar czf "$OUT/recall.tgz" --exclude=checkpoints --exclude=.jax_cache -C runs recall
}
sweep() {  # sweep LIMIT STEP ARGS...: PARALLEL (default 3) processes share the GPU, each a shard of the runs
  local limit=$1 name=$2 n=${PARALLEL:-3} i; shift 2
  # These models use a sliver of the card: each process gets 0.9 / n of its memory instead of the default 0.75
  # (CARD_SHARES=m: 0.9 / m, for several of these scripts at once, each with its own OUT, sharing m processes).
  local fraction; fraction=$(card_fraction "${CARD_SHARES:-$n}")
  if [ "$n" -le 1 ]; then
    (if [ -n "${CARD_SHARES:-}" ]; then export XLA_PYTHON_CLIENT_MEM_FRACTION=$fraction; fi
     run "$limit" python3 -m experiments.sweep --in_process --workdir="$RES/$name" "$@")
    return
  fi
  echo "== $n shards, each: python3 -m experiments.sweep --in_process --shard=i/$n --workdir=$RES/$name $* (limit ${limit}s)" \
    | tee -a "$OUT/log.txt"
  for i in $(seq 0 $((n - 1))); do
    XLA_PYTHON_CLIENT_MEM_FRACTION=$fraction timeout "$limit" python3 -m experiments.sweep --in_process \
      --shard="$i/$n" --workdir="$RES/$name" "$@" > "$OUT/shard_$i.txt" 2>&1 &
  done
  wait
  for i in $(seq 0 $((n - 1))); do
    echo "== shard $i/$n" | tee -a "$OUT/log.txt"
    grep -v -i "warning" "$OUT/shard_$i.txt" | grep -v -E "^  step [0-9]+/" | tee -a "$OUT/log.txt" >/dev/null
    rm -f "$OUT/shard_$i.txt"
  done
  run 120 python3 -m experiments.sweep --summarize_only --workdir="$RES/$name" --out="$RES/$name/summary"
}
MIXERS=${MIXERS:-gdn kda fg2_gdn fg2_gdn_plus gdn2 sdm swa attention}
variants() {  # variants TASK WIDTHS: 'TASK_<mixer>_w<width>|...' for every mixer and width
  local task=$1 widths=$2 list=()
  for m in $MIXERS; do for w in $widths; do list+=("${task}_${m}_w$w"); done; done
  (IFS='|'; echo "${list[*]}")
}
for step in ${*:-default}; do
  case $step in
    default)  # 2 runs x 3000 steps
      sweep 530 default --config=experiments/configs/mqar.py:gdn2 --grid='train.learning_rate=1e-2|3e-3' ;;
    state)  # 8 runs x 1500 steps a width and seed, evaluated again on fixed numbers of pairs (Zoology's test sets)
      sweep "${STEP_LIMIT:-530}" "${STATE_DIR:-state}" --config=experiments/configs/recall.py:mqar_gdn \
        --config.train.steps=1500 --grid="variant=$(variants mqar "$WIDTHS")${LRS:+;train.learning_rate=$LRS}" \
        --seeds="$SEEDS" --first_seed="$FIRST_SEED" \
        --eval_grid='data.min_kv_pairs=0;data.num_kv_pairs,data.num_queries=4,4|16,16|32,32' --eval_batches=4 ;;
    seqlen)  # MQAR at other sequence lengths (Zoology's 64-512): MIXERS x SEQ_POINTS runs x 1500 steps at width 128, the
      # state step's protocol with the largest number of pairs scaled to the length (seq_len / 8, mixed down to 4),
      # evaluated again at that largest number (min_kv_pairs=0)
      sweep "${STEP_LIMIT:-530}" "${SEQ_DIR:-seqlen}" --config=experiments/configs/recall.py:mqar_gdn \
        --config.train.steps=1500 \
        --grid="variant=$(variants mqar 128);data.seq_len,data.num_kv_pairs,data.num_queries=${SEQ_POINTS:-64,8,8|256,32,32|512,64,64}" \
        --seeds="$SEEDS" --first_seed="$FIRST_SEED" --eval_grid='data.min_kv_pairs=0' --eval_batches=4 ;;
    niah)  # 2 x NIAH_MIXERS runs x 3000 steps (the config's; 1500 left MK-NIAH-1 at chance, session 16) of 16 x 1024
      # bytes, 40-90 s each on the H200 (estimated from 1500 steps' 18-44 s): a step cut by its limit resumes with the
      # same call on the warm machine
      niah_variants=()
      for task in ${NIAH_TASKS:-s_niah_1 mk_niah_1}; do
        niah_variants+=("$(MIXERS="${NIAH_MIXERS:-gdn2 sdm swa attention}" variants "$task" 128)")
      done
      niah_variants="${NIAH_VARIANTS:-$(IFS='|'; echo "${niah_variants[*]}")}"
      sweep "${STEP_LIMIT:-530}" "${NIAH_DIR:-niah}" --config=experiments/configs/recall.py:s_niah_1_gdn2_w128 \
        --grid="variant=$niah_variants" \
        --eval_grid='data.seq_len,data.batch_size=1024,16|2048,8|4096,4|8192,2' --eval_batches=8 --seeds="$SEEDS" \
        --first_seed="$FIRST_SEED" ;;
    twins)  # whether XLA's deterministic GPU ops make a seed's run repeat, and their cost: TWIN_VARIANT (recall.py's,
      # default s_niah_3_attention_w128, whose twins ended 0.06 apart in session 28) trained TWIN_STEPS (default 1000)
      # steps by four processes at once, two with --xla_gpu_deterministic_ops and two without; then each pair's
      # training losses step by step (experiments.summarize_runs --twins) and their tokens/s
      dirs=() fraction=$(card_fraction "${CARD_SHARES:-4}")
      for mode in deterministic default; do
        for twin in a b; do
          dirs+=("$RES/twins/${mode}_$twin")
          (if [ $mode = default ]; then export XLA_FLAGS="${XLA_FLAGS//--xla_gpu_deterministic_ops=true/}"; fi
           XLA_PYTHON_CLIENT_MEM_FRACTION=$fraction timeout "${STEP_LIMIT:-400}" python3 -m experiments.train \
             --config=experiments/configs/recall.py:"${TWIN_VARIANT:-s_niah_3_attention_w128}" \
             --workdir="$RES/twins/${mode}_$twin" --config.train.steps="${TWIN_STEPS:-1000}" \
             > "$OUT/twins_${mode}_$twin.txt" 2>&1) &
        done
      done
      wait
      run 60 python3 -m experiments.summarize_runs --twins --workdirs="$(IFS=,; echo "${dirs[*]}")" \
        --out="$RES/twins/summary" ;;
    summary)
      for name in state niah; do
        run 120 python3 -m experiments.sweep --summarize_only --workdir="$RES/$name" --out="$RES/$name/summary"
      done ;;
    *) echo "unknown step $step" | tee -a "$OUT/log.txt" ;;
  esac
done
