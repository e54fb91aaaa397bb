#!/usr/bin/env bash
# The recall protocol (issue 48; experiments/configs/recall.py, benchmarks/recall/README.md "Protocol") on one H100,
# one piece per device call. PARALLEL processes (default 6) share the card, each a shard of one sweep
# (experiments.sweep --shard --in_process); every run lives in one workdir per kind under runs/recall_protocol/
# (mqar, niah, gates), so a run one piece finished (the pilot's seeds at the rate it picked, the sanity's attention
# runs) is skipped by the next. A sweep stops at STEP_LIMIT seconds (default 450): a run cut there keeps its
# checkpoint and resumes with the same command on the same warm machine (from step 0 on a fresh one). Then the
# piece's report (experiments.recall_report), whose table is printed last. XLA's deterministic GPU ops are on
# (--xla_gpu_deterministic_ops=true) so that a seed reruns to the same number; the sanity piece checks that with twins.
# Results: $OUT/log.txt, $OUT/report_<piece>.md and its plots, $OUT/recall_protocol.tgz (every run's metrics,
# evaluations and configs, no checkpoints).
#
# Device tool: command "bash benchmarks/recall/protocol.sh <piece>", carry [".whl"] (the wheels the image lacks,
# benchmarks/run_h200.sh), and "runs/carried" to bring finished runs back: a tgz's recall_protocol/<dir> unpacked at
# runs/carried/recall_protocol/<dir> is merged in without replacing the machine's.
# CPU check of a piece end to end at tiny sizes (4 steps a run, nothing learned, into runs/recall_protocol_dry):
#   DRY_RUN=1 bash benchmarks/recall/protocol.sh <piece>      (lr_pilot before mqar_pressure, niah, sdm_isoflop)
#
# Knobs (space-separated): MODELS (recall.py mixers), WIDTHS, POINTS ("seq_len,pairs ..." of recall.PRESSURE_POINTS),
# LRS (the pilot grid), STEPS (the sweep's train.steps instead of the task's), SEEDS and FIRST_SEED (seeds
# FIRST_SEED, FIRST_SEED + 1, ...), TASKS (niah, sdm_isoflop),
# PILOT_TASK (lr_pilot: mqar or niah), RATES (the pilot's picked rates; default benchmarks/recall/protocol/rates.json
# when committed, else this machine's runs/recall_protocol/report_lr_pilot_rates.json), PARALLEL, CARD_SHARES (0.9 /
# CARD_SHARES of the card's memory a process, for several of these scripts at once), STEP_LIMIT, ENSEMBLE (default 1:
# each point's seeds trained together by one vmapped step, `experiments.sweep --ensemble`; 0: one after another).
#
# Cost on one H100, of runs trained one by one (ENSEMBLE=0); what training a point's seeds together saves on the card
# is not measured yet. Card time per 1,000 training steps with 6 processes sharing it, from the earlier recall runs
# (benchmarks/history/recall.md, sessions 29 and 33): ~10 s at 128-256 tokens, ~15 s at 512, ~14 s for NIAH (1,024
# bytes x 16, 4 layers); ~25 s at 1,024 tokens is extrapolated, not measured. A run stops at accuracy 0.99 or after
# 4,000 (MQAR) / 6,000 (NIAH) steps: W = every run to its last step; E = the runs that learn stop at a third of it
# (a guess until the sanity piece measures it). A call has ~7 min of card time after ~1.5 min of start-up.
#   sanity         full attention at every POINT x WIDTH x LR, seed 0 (30 runs), beside two 500-step twins of one
#                  GDN-2 run: W 28 min, E ~12. Four calls: WIDTHS=128 or 256, each with POINTS="128,16 128,32 256,64"
#                  (W 6 min) and POINTS="512,128 1024,256" (W 8 min)
#   lr_pilot       MODELS (default attention gdn kda fg2_gdn fg2_gdn_plus gdn2 sdm swa_gdn) x LRS at the pilot
#                  (width 128, 64 pairs in 256 tokens), SEEDS=2 (48 runs, attention's seed 0 from sanity): W 30 min,
#                  E ~15; 2 models a call (W 8 min). PILOT_TASK=niah: the same on MK-NIAH-1 (1,024 bytes): W 67 min,
#                  1 model a call
#   mqar_pressure  MODELS (default attention gdn kda fg2_gdn fg2_gdn_plus gdn2), each at its pilot rate, x POINTS x
#                  WIDTHS x SEEDS=5 (300 runs, less the pilot's and sanity's): W 4.6 h, E ~2 h. A call: one POINT and
#                  WIDTH, 2 models x 5 seeds (W 7 min at 128-256 tokens); at 512 and 1,024 tokens 1 model, or
#                  SEEDS=3 then FIRST_SEED=3 SEEDS=2
#   niah           TASKS (default s_niah_1 mk_niah_1) x MODELS (default the lr_pilot's 8) at their NIAH rates, width
#                  128, SEEDS=5, evaluated at 1K-8K (80 runs): W 1.9 h, E ~1 h; one task and model a call (5 runs)
#   sdm_isoflop    MODELS (default sdm swa_gdn gdn) on TASKS (default mqar s_niah_1 mk_niah_1): MQAR at POINTS x
#                  WIDTHS=128, NIAH at 1K-8K, SEEDS=5; GDN's runs are mqar_pressure's and niah's, skipped when done:
#                  W 1.3 h for the two hybrids, E ~40 min; one task and model a call. MODELS=swa (the window alone,
#                  the floor) needs its pilot first (lr_pilot MODELS=swa)
#   gate_ablation  GDN-2 and KDA x their presets fla and official x LRS at the pilot point, SEEDS=5 (60 runs):
#                  W 40 min, E ~20; a call: one rate and up to 2 seeds (LRS=0.001 SEEDS=2, then FIRST_SEED=2
#                  SEEDS=2, then FIRST_SEED=4 SEEDS=1; 8 runs, W 5.5 min)
#   report         every piece's report again over the runs there (after merging carried runs), nothing trained
# All of it: W ~10.5 h of H100 time (~90 calls), E ~4-5 h (~40 calls). First the sanity and the MQAR pilot (~8
# calls); then the settings that decide the claims: the pilot point (64 pairs, width 128) and MK-NIAH-1.
set -u
piece=${1:-}
PIECES="sanity lr_pilot mqar_pressure niah sdm_isoflop gate_ablation report"
case " $PIECES " in
  *" $piece "*) [ -n "$piece" ] || { echo "protocol.sh: expected a piece, one of: $PIECES" >&2; exit 2; } ;;
  *) echo "protocol.sh: expected a piece, one of: $PIECES; got '$piece'" >&2; exit 2 ;;
esac
if [ -n "${DRY_RUN:-}" ]; then  # the CPU, tiny runs: every step of a piece but the learning
  PY=${PY:-.venv/bin/python}
  export JAX_PLATFORMS=cpu
  RES=${RES:-runs/recall_protocol_dry}
  OUT=${OUT:-/tmp/recall_protocol_dry}
  TINY=(--config.train.steps=4 --config.train.warmup_steps=1 --config.train.log_every=2 --config.train.eval_every=2
        --config.train.checkpoint_every=4 --config.data.batch_size=4 --config.train.eval_batches=1)
  NIAH_TINY=(--config.data.seq_len=256)
  NIAH_EVAL="data.seq_len,data.batch_size=256,4|512,2"
  WIDTHS=${WIDTHS:-64} POINTS=${POINTS:-128,16} LRS=${LRS:-0.001 0.01} PARALLEL=${PARALLEL:-1}
  TWIN_STEPS=4 EVAL_BATCHES=1
  DRY_MODELS="gdn2 kda"
else
  PY=python3
  # (installed once per machine: several of these scripts may run at once, CARD_SHARES)
  [ -d /tmp/site/grain ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:.
  RES=runs/recall_protocol
  OUT=${OUT:-/tmp/out}
  TINY=() NIAH_TINY=()
  NIAH_EVAL="data.seq_len,data.batch_size=1024,16|2048,8|4096,4|8192,2"
  TWIN_STEPS=${TWIN_STEPS:-500} EVAL_BATCHES=""
  DRY_MODELS=""
fi
# Without it the same seed run twice on the GPU has ended 0.05-0.28 apart (benchmarks/history/recall.md, sessions 25
# and 27): XLA's scatter-adds and reductions use atomics.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_deterministic_ops=true" PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$RES"
[ -d runs/carried/recall_protocol ] && cp -rn runs/carried/recall_protocol/. "$RES"/
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) piece: $piece" \
  | tee -a "$OUT/log.txt"
# The protocol's constants, from recall.py (one source).
eval "$($PY -c "
from experiments.configs import recall as r
print(f'P_POINTS=\"{\" \".join(f\"{s},{p}\" for s, p in r.PRESSURE_POINTS)}\"')
print(f'P_WIDTHS=\"{\" \".join(map(str, r.PRESSURE_WIDTHS))}\"')
print(f'P_RATES=\"{\" \".join(f\"{x:g}\" for x in r.LEARNING_RATES)}\"')
print(f'P_SEEDS={r.SEEDS} PILOT_WIDTH={r.PILOT_WIDTH} PILOT_POINT={r.PILOT_POINT[0]},{r.PILOT_POINT[1]}')
print(f'NIAH_PILOT_TASK={r.NIAH_PILOT_TASK}')
")" || { echo "protocol.sh: experiments/configs/recall.py does not load" >&2; exit 2; }
[ -n "${DRY_RUN:-}" ] && P_SEEDS=2 PILOT_SEEDS=1
MQAR_MODELS="attention gdn kda fg2_gdn fg2_gdn_plus gdn2"
FIRST_SEED=${FIRST_SEED:-0}
LRS=${LRS:-$P_RATES}
STEP_LIMIT=${STEP_LIMIT:-450}

card_fraction() {  # card_fraction N: each of N processes sharing the card gets 0.9 / N of its memory
  $PY -c "print(round(0.9 / $1, 3))"
}
pack() {
  tar czf "$OUT/recall_protocol.tgz" --exclude=checkpoints --exclude=.jax_cache -C "$(dirname "$RES")" \
    "$(basename "$RES")"
}
sweep() {  # sweep DIR ARGS...: PARALLEL shards of one sweep into $RES/DIR, each under STEP_LIMIT, then its summary
  local dir=$1 n=${PARALLEL:-6} i fraction shards=(); shift
  fraction=$(card_fraction "${CARD_SHARES:-$n}")
  echo "== $n shard(s): $PY -m experiments.sweep --in_process --workdir=$RES/$dir $* (limit ${STEP_LIMIT}s)" \
    | tee -a "$OUT/log.txt"
  for i in $(seq 0 $((n - 1))); do
    XLA_PYTHON_CLIENT_MEM_FRACTION=$fraction timeout "$STEP_LIMIT" $PY -m experiments.sweep --in_process \
      --ensemble="$([ "${ENSEMBLE:-1}" = 1 ] && echo true || echo false)" \
      --shard="$i/$n" --workdir="$RES/$dir" "$@" ${EVAL_BATCHES:+--eval_batches=$EVAL_BATCHES} "${TINY[@]}" \
      ${STEPS:+--config.train.steps=$STEPS} \
      > "$OUT/shard_$i.txt" 2>&1 &
    shards+=($!)
  done
  wait "${shards[@]}"
  for i in $(seq 0 $((n - 1))); do
    echo "== shard $i/$n" >> "$OUT/log.txt"
    grep -v -i "warning" "$OUT/shard_$i.txt" | grep -v -E "^  step [0-9]+/" >> "$OUT/log.txt"
    grep -E "done in|FAILED|failed" "$OUT/shard_$i.txt"
    rm -f "$OUT/shard_$i.txt"
  done
  timeout 120 $PY -m experiments.sweep --summarize_only --workdir="$RES/$dir" --out="$RES/$dir/summary" \
    >> "$OUT/log.txt" 2>&1
  pack
}
variants() {  # variants TASK MODELS WIDTHS rates|picked: recall.protocol_variants, one line on stderr if it fails
  local rates=None picked=None
  if [ "$4" = picked ]; then picked="'$(rates_file)'" || return 2; else rates="'$LRS'"; fi
  $PY -c "
import sys
from experiments.configs import recall
try:
  print(recall.protocol_variants('$1', '$2', '$3', rates=$rates, picked=$picked))
except ValueError as error:
  sys.exit(f'protocol.sh: {error}')"
}
rates_file() {  # the pilot's picked rates: RATES, else the committed record, else this machine's pilot report
  local committed=benchmarks/recall/protocol/rates.json machine=$RES/report_lr_pilot_rates.json
  if [ -n "${RATES:-}" ]; then echo "$RATES"
  elif [ -z "${DRY_RUN:-}" ] && [ -f "$committed" ]; then echo "$committed"
  elif [ -f "$machine" ]; then echo "$machine"
  else echo "protocol.sh: no pilot rates: expected RATES, $committed or $machine (run lr_pilot first)" >&2; return 2
  fi
}
points_axis() {  # points_axis "seq_len,pairs ...": the grid axis, as many queries as pairs
  local list=() point
  for point in $1; do list+=("$point,${point#*,}"); done
  (IFS='|'; echo "data.seq_len,data.num_kv_pairs,data.num_queries=${list[*]}")
}
mqar_sweep() {  # mqar_sweep VARIANTS POINTS SEEDS: the MQAR runs, evaluated again at the largest pairs alone
  sweep mqar --config=experiments/configs/recall.py:mqar_gdn --grid="variant=$1;$(points_axis "$2")" \
    --seeds="$3" --first_seed="$FIRST_SEED" --eval_grid='data.min_kv_pairs=0'
}
niah_sweep() {  # niah_sweep VARIANTS SEEDS: NIAH runs at 1K, evaluated at 1K-8K
  sweep niah --config=experiments/configs/recall.py:s_niah_1_gdn --grid="variant=$1" --seeds="$2" \
    --first_seed="$FIRST_SEED" --eval_grid="$NIAH_EVAL" "${NIAH_TINY[@]}"
}
report() {  # report PIECE NAME WORKDIR... : experiments.recall_report over the workdirs that exist, into $OUT too
  local report_piece=$1 name=$2 dirs=() dir rates=""; shift 2
  for dir in "$@"; do [ -d "$RES/$dir" ] && dirs+=("$RES/$dir"); done
  [ ${#dirs[@]} -gt 0 ] || { echo "== report $name: no runs yet" | tee -a "$OUT/log.txt"; return; }
  if [ "$report_piece" = outcomes ]; then rates=$(rates_file 2>/dev/null); fi
  echo "== report $name" | tee -a "$OUT/log.txt"
  timeout 300 $PY -m experiments.recall_report --piece="$report_piece" --out="$RES/report_$name" \
    --workdirs="$(IFS=,; echo "${dirs[*]}")" ${rates:+--rates=$rates} 2>&1 | grep -v -i warning \
    | tee -a "$OUT/log.txt"
  cp "$RES"/report_"$name"* "$OUT"/ 2>/dev/null
  pack
}
niah_variants() {  # niah_variants MODELS: every TASK's variants at width 128, each model at its NIAH rate
  local list=() task
  for task in $TASKS_NIAH; do
    names=$(variants "$task" "$1" 128 picked) || return 2
    list+=("$names")
  done
  (IFS='|'; echo "${list[*]}")
}

case $piece in
  sanity)
    twins=()
    if [ "${TWINS:-1}" = 1 ]; then  # the same GDN-2 run twice at once, beside the sweep: does a seed repeat?
      # The twins share the card with the sweep's PARALLEL processes: every process gets 0.9 / (PARALLEL + 2) of it.
      CARD_SHARES=${CARD_SHARES:-$((${PARALLEL:-6} + 2))}
      for twin in a b; do
        XLA_PYTHON_CLIENT_MEM_FRACTION=$(card_fraction "$CARD_SHARES") timeout "$STEP_LIMIT" \
          $PY -m experiments.train --config=experiments/configs/recall.py:mqar_gdn2_w"$PILOT_WIDTH" \
          --workdir="$RES/twins/$twin" \
          --config.data.seq_len="${PILOT_POINT%,*}" --config.data.num_kv_pairs="${PILOT_POINT#*,}" \
          --config.data.num_queries="${PILOT_POINT#*,}" "${TINY[@]}" --config.train.steps="$TWIN_STEPS" \
          > "$OUT/twin_$twin.txt" 2>&1 &
        twins+=($!)
      done
    fi
    mqar_sweep "$(variants mqar attention "${WIDTHS:-$P_WIDTHS}" rates)" "${POINTS:-$P_POINTS}" "${SEEDS:-1}"
    if [ ${#twins[@]} -gt 0 ]; then
      wait "${twins[@]}"
      $PY -m experiments.summarize_runs --twins --workdirs="$RES/twins/a,$RES/twins/b" --out="$RES/twins/summary" \
        2>&1 | grep -v -i warning | tail -4 | tee -a "$OUT/log.txt"
    fi
    report sanity sanity mqar ;;
  lr_pilot)
    if [ "${PILOT_TASK:-mqar}" = niah ]; then
      TASKS_NIAH=$NIAH_PILOT_TASK
      list=$(variants "$NIAH_PILOT_TASK" "${MODELS:-${DRY_MODELS:-$MQAR_MODELS sdm swa_gdn}}" "$PILOT_WIDTH" rates) \
        || exit 2
      niah_sweep "$list" "${SEEDS:-${PILOT_SEEDS:-2}}"
    else
      list=$(variants mqar "${MODELS:-${DRY_MODELS:-$MQAR_MODELS sdm swa_gdn}}" "$PILOT_WIDTH" rates) || exit 2
      mqar_sweep "$list" "$PILOT_POINT" "${SEEDS:-${PILOT_SEEDS:-2}}"
    fi
    report lr_pilot lr_pilot mqar niah ;;
  mqar_pressure)
    list=$(variants mqar "${MODELS:-${DRY_MODELS:-$MQAR_MODELS}}" "${WIDTHS:-$P_WIDTHS}" picked) || exit 2
    mqar_sweep "$list" "${POINTS:-$P_POINTS}" "${SEEDS:-$P_SEEDS}"
    report outcomes mqar_pressure mqar ;;
  niah)
    TASKS_NIAH=${TASKS:-s_niah_1 mk_niah_1}
    list=$(niah_variants "${MODELS:-${DRY_MODELS:-$MQAR_MODELS sdm swa_gdn}}") || exit 2
    niah_sweep "$list" "${SEEDS:-$P_SEEDS}"
    report outcomes niah niah ;;
  sdm_isoflop)
    models=${MODELS:-${DRY_MODELS:+sdm gdn2}}
    models=${models:-sdm swa_gdn gdn}
    tasks=${TASKS:-mqar s_niah_1 mk_niah_1}
    TASKS_NIAH=$(echo " $tasks " | sed 's/ mqar / /; s/^ *//; s/ *$//')
    if [[ " $tasks " == *" mqar "* ]]; then
      list=$(variants mqar "$models" "${WIDTHS:-$PILOT_WIDTH}" picked) || exit 2
      mqar_sweep "$list" "${POINTS:-$P_POINTS}" "${SEEDS:-$P_SEEDS}"
    fi
    if [ -n "$TASKS_NIAH" ]; then
      list=$(niah_variants "$models") || exit 2
      niah_sweep "$list" "${SEEDS:-$P_SEEDS}"
    fi
    report outcomes sdm_isoflop mqar niah ;;
  gate_ablation)
    list=$(variants mqar "gdn2 kda" "$PILOT_WIDTH" rates) || exit 2
    sweep gates --config=experiments/configs/recall.py:mqar_gdn2 \
      --grid="variant=$list;model.delta.preset=fla|official;$(points_axis "$PILOT_POINT")" \
      --seeds="${SEEDS:-$P_SEEDS}" --first_seed="$FIRST_SEED" --eval_grid='data.min_kv_pairs=0'
    report gate_ablation gate_ablation gates ;;
  report)
    report sanity sanity mqar
    report lr_pilot lr_pilot mqar niah
    report gate_ablation gate_ablation gates
    report outcomes all mqar niah ;;
esac
