r"""Times the mixer ops (forward, forward+backward) over shapes, against flash-linear-attention.

  python -m experiments.bench_ops --mixers=kda,gdn2 --impls=chunk --tag=chunk_h200
  python -m experiments.bench_ops --merge=a.json,b.json --tag=kda   # one report (table, plot) from several runs

Writes <out_dir>/<date>_<tag>.{json,md,png} (default runs/bench/) and prints the short table last. On a CPU backend
the default shapes shrink to 1x256 with --heads=2 --head_dim=32 unless given explicitly.
"""

import os

from absl import app, flags

from experiments import cli
from sdm_jax.benchmarking.op_bench import format_table, merge_reports, parse_shapes, run_sweep, write_report
from sdm_jax.benchmarking.timing import run_metadata
from sdm_jax.ops import MIXERS
from sdm_jax.training.config import close_names

flags.DEFINE_list("mixers", ["kda", "gdn2"], f"Mixers to time, from {sorted(MIXERS)}.")
flags.DEFINE_list("impls", ["chunk"], "Impls to time (scan, chunk, pallas).")
flags.DEFINE_string("shapes", "8x2048,4x4096,2x8192,1x16384,1x32768", "Comma-separated BxT.")
flags.DEFINE_integer("heads", 16, "H.")
flags.DEFINE_integer("head_dim", 128, "K, the key dimension per head.")
flags.DEFINE_integer("value_dim", None, "V, the value dimension per head (default: head_dim).")
flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float16", "float32"], "Input dtype (g stays fp32).")
flags.DEFINE_integer("chunk_size", 64, "Chunk size of the chunked impls.")
flags.DEFINE_integer("reps", 20, "Warm runs per timing (median).")
flags.DEFINE_integer("seed", 0, "Seed of the first of the 3 input sets.")
flags.DEFINE_boolean("peer", True, "Also time fla's Triton chunk_kda / chunk_gdn2 where importable.")
flags.DEFINE_string("out_dir", "runs/bench", "Where the JSON, markdown and PNG go (untracked: copy a report that "
                    "matters into benchmarks/ with its record).")
flags.DEFINE_string("tag", "ops", "File name tag: <out_dir>/<date>_<tag>.*")
flags.DEFINE_list("merge", [], "Instead of timing: the JSON reports of earlier runs, written as one report.")
FLAGS = flags.FLAGS

CPU_DEFAULTS = {"shapes": "1x256", "heads": 2, "head_dim": 32}


def main(argv):
  del argv
  if FLAGS.merge:
    records, meta = merge_reports(FLAGS.merge)
    paths = write_report(records, meta, FLAGS.out_dir, FLAGS.tag)
    print("wrote " + ", ".join(paths.values()) + "\n" + format_table(records))
    return
  if FLAGS.peer:
    # torch allocates on the same GPU, so JAX takes half of it up front rather than its default 75%. Not
    # preallocating at all instead doubled KDA's forward+backward back to back (DESIGN.md section 7).
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
  cli.setup(CPU_DEFAULTS)
  unknown = sorted(set(FLAGS.mixers) - set(MIXERS))
  if unknown:
    raise app.UsageError(f"--mixers: unknown {unknown}, expected some of {sorted(MIXERS)}"
                         f"{close_names(unknown[0], MIXERS)}")
  config = {name: FLAGS[name].value for name in ("mixers", "impls", "shapes", "heads", "head_dim", "value_dim",
                                                  "dtype", "chunk_size", "reps", "seed", "peer")}
  meta = run_metadata()
  report = lambda records, notes: write_report(records, {**meta, "config": config, "peer": notes}, FLAGS.out_dir,
                                               FLAGS.tag)
  records, peer_notes = run_sweep(
      FLAGS.mixers, FLAGS.impls, parse_shapes(FLAGS.shapes), H=FLAGS.heads, K=FLAGS.head_dim,
      V=FLAGS.value_dim or FLAGS.head_dim, dtype=FLAGS.dtype, chunk_size=FLAGS.chunk_size, reps=FLAGS.reps,
      seed=FLAGS.seed, peer=FLAGS.peer, log=lambda line: print(line, flush=True), on_progress=report)
  paths = report(records, peer_notes)
  print("\nwrote " + ", ".join(paths.values()))
  print(f"\n{meta['device']}, {FLAGS.dtype}, H={FLAGS.heads} K={FLAGS.head_dim}; "
        "vs fla = fla ms / our ms\n" + format_table(records))


if __name__ == "__main__":
  cli.run(main)
