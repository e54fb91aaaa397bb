r"""Puts training runs side by side: final and best evaluation accuracy, loss and training tokens/s.

  python -m experiments.summarize_runs --workdirs=runs/mqar_gdn2,runs/mqar_kda --out=runs/mqar_summary

Writes <out>.md (the table, printed too) and <out>.png (evaluation accuracy against step, a line per run).
Training tokens/s is the last progress line's: wall time of training steps since the first logged
step (compilation, evaluation and checkpointing left out; the per-step host sync included).
"""

import pathlib

from absl import app, flags

from experiments import cli
from sdm_jax.training.metrics import summarize_run

flags.DEFINE_list("workdirs", None, "Run directories written by experiments.train (required).")
flags.DEFINE_string("out", None, "Path prefix of the .md and .png written (default: print only).")
FLAGS = flags.FLAGS


def format_table(rows):
  fmt = lambda x, spec: "-" if x is None else format(x, spec)
  lines = ["| run | pattern | mixer | impl | width x layers | steps | eval acc | best eval acc | eval loss | "
           "train tok/s |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['run']} | {r['pattern']} | {r['mixer']} | {r['impl']} | {r['width']} x {r['layers']} | "
                 f"{r['steps']} | {fmt(r['eval_accuracy'], '.4f')} | {fmt(r['best_eval_accuracy'], '.4f')} | "
                 f"{fmt(r['eval_loss'], '.4f')} | {fmt(r['train_tokens_per_s'], ',.0f')} |")
  return "\n".join(lines)


def plot_curves(rows, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.5, 4))
  for r in rows:
    if r["eval_curve"]:
      ax.plot(*zip(*r["eval_curve"]), marker="o", label=r["run"])
  ax.set(xlabel="step", ylabel="evaluation accuracy", ylim=(0, 1.02))
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  if not FLAGS.workdirs:  # checked here, not as a required flag: tests import several tools' flags at once
    raise app.UsageError("--workdirs: expected one or more run directories")
  rows = [summarize_run(workdir) for workdir in FLAGS.workdirs]
  table = format_table(rows)
  if FLAGS.out:
    out = pathlib.Path(FLAGS.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(table + "\n")
    plot_curves(rows, out.with_suffix(".png"))
  print(table)


if __name__ == "__main__":
  cli.run(main)
