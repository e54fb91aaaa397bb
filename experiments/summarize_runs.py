r"""Puts training runs side by side: final and best evaluation accuracy, loss and training tokens/s.

  python -m experiments.summarize_runs --workdirs=runs/mqar_gdn2,runs/mqar_kda --out=runs/mqar_summary

Writes <out>.md (the table, printed too) and <out>.png (evaluation accuracy against step, a line per run).
--twins: the runs are pairs of the same program (the same seed twice; workdirs a1,b1,a2,b2,...), and a second
table compares each pair's training losses step by step (the first step where they differ, none if bit-identical).
Training tokens/s is the last progress line's: wall time of training steps since the first logged
step (compilation, evaluation and checkpointing left out; the per-step host sync included).
"""

import pathlib

from absl import app, flags

from experiments import cli
from sdm_jax.evaluation.run_summary import format_table, format_twins, plot_curves, summarize_run, twin_difference

flags.DEFINE_list("workdirs", None, "Run directories written by experiments.train (required).")
flags.DEFINE_string("out", None, "Path prefix of the .md and .png written (default: print only).")
flags.DEFINE_bool("twins", False, "The workdirs are pairs of runs of the same program: compare each pair's losses.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if not FLAGS.workdirs:  # a clearer line than absl's for a missing required flag
    raise app.UsageError("--workdirs: expected one or more run directories")
  try:
    rows = [summarize_run(workdir) for workdir in FLAGS.workdirs]
  except ValueError as error:  # a missing or damaged run directory
    cli.fail(error)
  table = format_table(rows)
  if FLAGS.twins:
    if len(rows) % 2:
      raise app.UsageError(f"--twins: expected pairs of run directories, got {len(rows)}")
    try:
      pairs = [(rows[i], rows[i + 1], twin_difference(FLAGS.workdirs[i], FLAGS.workdirs[i + 1]))
               for i in range(0, len(rows), 2)]
    except ValueError as error:
      cli.fail(error)
    table += "\n\n" + format_twins(pairs)
  if FLAGS.out:
    out = pathlib.Path(FLAGS.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(table + "\n")
    plot_curves(rows, out.with_suffix(".png"))
  print(table)


if __name__ == "__main__":
  cli.run(main)
