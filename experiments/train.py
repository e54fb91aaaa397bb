r"""Trains a language model from a config file.

  python -m experiments.train --config=experiments/configs/mqar.py:gdn2 --workdir=runs/mqar_gdn2

Resumes from the newest readable checkpoint in --workdir unless --noresume. On several hosts pass
--coordinator_address, --num_processes and --process_id (jax.distributed.initialize).
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from experiments import cli

config_flags.DEFINE_config_file("config", None, "Config file, path.py:variant.", lock_config=False)
flags.DEFINE_string("workdir", None, "Where checkpoints, metrics.jsonl and plots go.", required=True)
flags.DEFINE_boolean("resume", True, "Continue from the newest checkpoint in --workdir.")
flags.DEFINE_integer("stop_after", None, "Stop after this many steps of this call (the run can be resumed).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-host runs.")
flags.DEFINE_integer("num_processes", None, "Number of processes, for multi-host runs.")
flags.DEFINE_integer("process_id", None, "This process's index, for multi-host runs.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup()
  import jax
  if FLAGS.coordinator_address:
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  from sdm_jax.training.loop import TrainingDiverged, train
  try:
    step = train(FLAGS.config, FLAGS.workdir, resume=FLAGS.resume, stop_after=FLAGS.stop_after,
                 log=lambda line: print(line, flush=True))
  except TrainingDiverged as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  print(f"stopped at step {step}; checkpoints, metrics.jsonl and metrics.png are in {FLAGS.workdir}")


if __name__ == "__main__":
  app.run(main)
