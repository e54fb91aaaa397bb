r"""Compares the impls of one mixer: o, final state and every gradient, plus compile and run times.

  python -m experiments.compare_impls --mixer=gdn2 --impls=scan,chunk --batch=2 --seq_len=1024 \
      --heads=4 --head_dim=64 --dtype=float32

The first impl is the reference. Exits non-zero when any compared quantity is non-finite.
"""

import os
import sys

from absl import flags
import jax

from experiments import cli
from sdm_jax import jsonio
from sdm_jax.benchmarking.op_compare import compare_impls, format_report
from sdm_jax.benchmarking.timing import run_metadata
from sdm_jax.ops import MIXERS

flags.DEFINE_enum("mixer", "gdn2", list(MIXERS), "Which mixer to run.")
flags.DEFINE_list("impls", ["scan", "chunk"], "Impls to compare; the first is the reference.")
flags.DEFINE_integer("batch", 2, "B.")
flags.DEFINE_integer("seq_len", 1024, "T.")
flags.DEFINE_integer("heads", 4, "H.")
flags.DEFINE_integer("head_dim", 64, "K, the key dimension per head.")
flags.DEFINE_integer("value_dim", None, "V, the value dimension per head (default: head_dim).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16", "float16", "float64"], "Input dtype.")
flags.DEFINE_integer("chunk_size", 64, "Chunk size of the chunked impls.")
flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")
flags.DEFINE_boolean("initial_state", True, "Start from a random initial state (and differentiate it).")
flags.DEFINE_integer("reps", 5, "Warm runs per timing (median).")
flags.DEFINE_string("out_json", None, "Also write the full report to this JSON file.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup()
  if FLAGS.out_json and not os.path.isdir(os.path.dirname(os.path.abspath(FLAGS.out_json))):
    cli.fail(f"--out_json={FLAGS.out_json}: its directory does not exist")
  if FLAGS.dtype == "float64":
    jax.config.update("jax_enable_x64", True)
  try:
    report = compare_impls(
        FLAGS.mixer, FLAGS.impls, B=FLAGS.batch, T=FLAGS.seq_len, H=FLAGS.heads, K=FLAGS.head_dim,
        V=FLAGS.value_dim or FLAGS.head_dim, dtype=FLAGS.dtype, chunk_size=FLAGS.chunk_size, seed=FLAGS.seed,
        initial_state=FLAGS.initial_state, reps=FLAGS.reps, log=lambda line: print(line, flush=True))
  except (ValueError, NotImplementedError) as error:
    cli.fail(error)  # an impl, shape or dtype the mixer cannot run
  print()
  print(format_report(report))
  if FLAGS.out_json:
    with open(FLAGS.out_json, "w") as f:
      f.write(jsonio.dumps({**run_metadata(), **report}, indent=2))
    print(f"\nwrote {FLAGS.out_json}")
  if not report["all_finite"]:
    bad = [f"{pair}: {row['quantity']}" for pair, rows in report["comparisons"].items()
           for row in rows if not row["finite"]]
    sys.exit(f"compare_impls: non-finite values in {', '.join(bad)}")


if __name__ == "__main__":
  cli.run(main)
