r"""Trains a grid of configs x seeds, one run per sub-workdir, and summarizes them with intervals over seeds.

  .venv/bin/python -m experiments.sweep --config=experiments/configs/recall.py:mqar_gdn \
      --grid='variant=mqar_gdn|mqar_kda;model.width=64|128' --seeds=3 --workdir=runs/mqar_study
  .venv/bin/python -m experiments.sweep --config=experiments/configs/recall.py:s_niah_1_gdn --seeds=3 \
      --eval_grid='data.seq_len=1024|2048|4096|8192' --workdir=runs/niah_study
  .venv/bin/python -m experiments.sweep --summarize_only --workdir=runs/study_a,runs/study_b --out=runs/study

--grid: 'axis=v1|v2;axis2=...' over config fields (model.mixer, model.width, data.seq_len, data.num_kv_pairs),
several fields set together ('data.seq_len,data.num_kv_pairs=64,4|128,8') or `variant`, the config file's own
variants; values parsed as --config.<field> parses them. --eval_grid: data fields each finished run is evaluated
again with (length extrapolation). Each run is a process of its own (a crash costs only that run; see
sdm_jax/training/sweep.py); a finished run is skipped and an interrupted one resumes, so the same command
continues a sweep. Then <workdir>/summary.{json,md} and summary_<axis>.png (see sdm_jax/training/sweep_summary.py).
Ctrl-C (SIGINT) or SIGTERM stops the running run at a step boundary with its checkpoint, then the sweep (exit 130 /
143, the command that resumes it printed); a second signal stops at once. --dry_run checks every point's config.
--summarize_only merges the runs of several workdirs (comma-separated) into --out; an earlier summary's .json among
them brings the runs it recorded. --shard=i/n runs every n-th planned
run from the i-th: n such processes (e.g. small models sharing one GPU) split one sweep between them.
"""

import shlex
import sys

from absl import app, flags
from ml_collections import config_flags

from experiments import cli

config_flags.DEFINE_config_file("config", None, "Config file, path.py:variant (the grid's base).", lock_config=False)
flags.DEFINE_string("grid", "", "Axes: 'field=v1|v2;field2=...' (see the module docstring).")
flags.DEFINE_string("eval_grid", "", "Evaluation points: 'data.field=v1|v2;...' each finished run is evaluated at.")
flags.DEFINE_integer("seeds", 1, "Replicates per grid point (seeds first_seed ...).", lower_bound=1)
flags.DEFINE_integer("first_seed", 0, "The first replicate's number (split a point's seeds over calls).",
                     lower_bound=0)
flags.DEFINE_string("workdir", None, "The sweep's directory; with --summarize_only, comma-separated sweep "
                    "directories (or earlier summaries' .json) to merge.", required=True)
flags.DEFINE_integer("eval_batches", None, "Batches per evaluation (default: the config's train.eval_batches).",
                     lower_bound=1)
flags.DEFINE_boolean("summarize_only", False, "Train nothing: summarize the finished runs under --workdir.")
flags.DEFINE_boolean("dry_run", False, "Print the runs and their status, train nothing.")
flags.DEFINE_boolean("in_process", False, "Run every run in this process (no start-up or compilation per run; "
                     "a crash ends the sweep) instead of one process each.")
flags.DEFINE_boolean("ensemble", False, "With --in_process: the seeds of a grid point trained together, one vmapped "
                     "step for all (sdm_jax/training/ensemble.py: small models that leave the device idle).")
flags.DEFINE_string("out", None, "Path prefix of the summary (default: <first workdir>/summary).")
flags.DEFINE_string("shard", "0/1", "i/n: run only the planned runs i, i + n, ... (n processes sharing one device, "
                    "each with its own shard; then --summarize_only over the workdir).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup()
  log = lambda line: print(line, flush=True)
  if FLAGS.summarize_only:
    from sdm_jax.training.sweep_summary import summarize
    workdirs = [workdir for workdir in FLAGS.workdir.split(",") if workdir]
    if not workdirs:
      raise app.UsageError("--workdir: expected one or more sweep directories or summaries' .json")
    try:
      summarize(workdirs, FLAGS.out or f"{workdirs[0]}/summary", log=log)
    except ValueError as error:  # a missing directory, a damaged summary, no finished run
      cli.fail(error)
    return
  if FLAGS.config is None:
    raise app.UsageError("--config: expected path/to/config.py:variant (required unless --summarize_only)")
  from sdm_jax.training.sweep import SweepInterrupted, parse_shard, sweep
  try:
    shard = parse_shard(FLAGS.shard)
  except ValueError as error:
    raise app.UsageError(str(error)) from None
  try:
    outcomes = sweep(FLAGS.config, config_file=config_flags.get_config_filename(FLAGS["config"]),
                     overrides=config_flags.get_override_values(FLAGS["config"]), grid=FLAGS.grid,
                     eval_grid=FLAGS.eval_grid, seeds=range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds),
                     workdir=FLAGS.workdir, eval_batches=FLAGS.eval_batches, dry_run=FLAGS.dry_run,
                     in_process=FLAGS.in_process, ensemble=FLAGS.ensemble, out=FLAGS.out, shard=shard, log=log)
  except SweepInterrupted as error:
    command = shlex.join([sys.executable, "-m", "experiments.sweep", *sys.argv[1:]])
    print(f"{error}. Resume the sweep with:\n  {command}", file=sys.stderr, flush=True)
    sys.exit(128 + error.signum)
  if any(outcome.startswith("failed") for outcome in outcomes.values()):
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
