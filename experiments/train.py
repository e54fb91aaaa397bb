r"""Trains a language model from a config file.

  .venv/bin/python -m experiments.train --config=experiments/configs/mqar.py:gdn2 --workdir=runs/mqar_gdn2

Resumes from the newest good checkpoint in --workdir. A workdir remembers its config: a resume with a config that
differs beyond sdm_jax.training.config.RESUMABLE_FIELDS is refused, and so is --noresume over checkpoints;
--overwrite deletes the run in --workdir and starts afresh. Nothing is written before the config checks pass.
Ctrl-C (SIGINT) or SIGTERM stops at the next step boundary and saves a checkpoint there; run the same command again
to resume. Exit codes: 0 done (or --stop_after reached), 1 diverged (non-finite loss, gradient norm or state),
2 a bad flag, config, workdir or data file (a shard found damaged mid-run stops the run, a checkpoint saved at the
step reached), 130 / 143 stopped by SIGINT / SIGTERM (a second signal stops at once). On several hosts pass
--coordinator_address, --num_processes and --process_id (jax.distributed.initialize).
"""

import shlex
import sys

from absl import app, flags
from ml_collections import config_flags

from experiments import cli

config_flags.DEFINE_config_file("config", None, "Config file, path.py:variant (default, with a --workdir that holds "
                                "a run: that run's own config.json, e.g. a run experiments.convert wrote).",
                                lock_config=False)
flags.DEFINE_string("workdir", None, "Where checkpoints, metrics.jsonl and plots go (required unless "
                    "--print_config).")
flags.DEFINE_boolean("print_config", False, "Print the resolved config (the variant with its --config.* "
                     "overrides) as JSON, as the run's config.json would hold it, and exit without training.")
flags.DEFINE_boolean("resume", True, "Continue from the newest checkpoint in --workdir; --noresume refuses a "
                     "workdir with checkpoints unless --overwrite.")
flags.DEFINE_boolean("overwrite", False, "Delete the run in --workdir (checkpoints, metrics, config) and start "
                     "afresh.")
flags.DEFINE_integer("stop_after", None, "Stop after this many steps of this call (the run can be resumed).",
                     lower_bound=1)
flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-host runs.")
flags.DEFINE_integer("num_processes", None, "Number of processes, for multi-host runs.")
flags.DEFINE_integer("process_id", None, "This process's index, for multi-host runs.")
FLAGS = flags.FLAGS


def resume_command():
  """This call's command line without the flags that would start afresh."""
  starting = {"--overwrite", "-overwrite", "--noresume", "-noresume"}
  args = [arg for arg in sys.argv[1:] if arg not in starting]
  return shlex.join([sys.executable, "-m", "experiments.train", *args])


def main(argv):
  del argv
  cli.setup()
  config = FLAGS.config
  if config is None:
    import pathlib
    from sdm_jax.training.workdir import CONFIG, load_config
    if FLAGS.workdir is None or not (pathlib.Path(FLAGS.workdir) / CONFIG).exists():
      raise app.UsageError("--config: expected path/to/config.py:variant (or a --workdir holding a run), got none")
    config = load_config(FLAGS.workdir)
  if FLAGS.print_config:
    print(config.to_json_best_effort(indent=2))
    return
  if FLAGS.workdir is None:
    raise app.UsageError("--workdir: expected the run directory (a path), got none")
  import jax
  if FLAGS.coordinator_address:
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  from sdm_jax.data import DataError
  from sdm_jax.training.loop import TrainingDataError, TrainingDiverged, TrainingInterrupted, train
  from sdm_jax.training.workdir import absolute_paths
  try:
    step = train(absolute_paths(config), FLAGS.workdir, resume=FLAGS.resume, overwrite=FLAGS.overwrite,
                 stop_after=FLAGS.stop_after, log=lambda line: print(line, flush=True))
  except (TrainingDataError, DataError) as error:  # a shard damaged after the run's checks: no traceback
    cli.fail(error)
  except TrainingDiverged as error:
    print(f"error: {error}; metrics.png is in {FLAGS.workdir}", file=sys.stderr, flush=True)
    sys.exit(1)
  except TrainingInterrupted as error:
    print(f"{error}; metrics.png is in {FLAGS.workdir}. Resume with:\n  {resume_command()}", file=sys.stderr,
          flush=True)
    sys.exit(128 + error.signum)
  print(f"stopped at step {step}; checkpoints, metrics.jsonl and metrics.png are in {FLAGS.workdir}")


if __name__ == "__main__":
  cli.run(main)
