"""Run summaries: one row per run directory from its own files (config.json, metrics.jsonl), a table, a plot."""

import json
import pathlib

from sdm_jax.tables import Column, table
from sdm_jax.training.metrics import MetricsLog


def _records(workdir):
  """A run directory's metrics records, or ValueError naming the directory if it has none or they do not read."""
  workdir = pathlib.Path(workdir)
  if not workdir.is_dir():
    raise ValueError(f"workdir: {str(workdir)!r} is not a directory; expected a run directory of experiments.train")
  if not (workdir / "metrics.jsonl").exists():
    raise ValueError(f"workdir: expected a run directory with metrics.jsonl, got {str(workdir)!r} (a run writes it "
                     f"at its first logged step)")
  try:
    return MetricsLog(workdir).read()
  except (ValueError, KeyError, TypeError) as error:
    raise ValueError(f"workdir: {str(workdir / 'metrics.jsonl')!r} is damaged: expected one JSON record a line "
                     f"({type(error).__name__}: {error})") from None


def summarize_run(workdir):
  """One row for a run directory: its model, final and best evaluation, and training tokens/s."""
  workdir = pathlib.Path(workdir)
  records = _records(workdir)
  try:
    model = json.loads((workdir / "config.json").read_text())["model"]
  except (OSError, ValueError, KeyError, TypeError) as error:
    raise ValueError(f"workdir: {str(workdir / 'config.json')!r}: expected the run's config as JSON "
                     f"({type(error).__name__}: {error})") from None
  evals = [r for r in records if r["split"] == "eval"]
  rates = [r["tokens_per_s"] for r in records if r["split"] == "train" and "tokens_per_s" in r]
  return {
      "run": workdir.name, "pattern": model["pattern"], "mixer": model["mixer"], "impl": model["impl"],
      "width": model["width"], "layers": model["num_layers"],
      "steps": max((r["step"] for r in records), default=0),
      "eval_accuracy": evals[-1]["accuracy"] if evals else None,
      "best_eval_accuracy": max((r["accuracy"] for r in evals), default=None),
      "eval_loss": evals[-1]["loss"] if evals else None,
      "train_tokens_per_s": rates[-1] if rates else None,
      "eval_curve": [(r["step"], r["accuracy"]) for r in evals],
  }


def twin_difference(workdir_a, workdir_b):
  """Two runs of the same program (e.g. the same seed twice) compared step by step on their training loss: the logged
  steps both have, the first of them where the losses differ (None: identical at every one, bit for bit), and the
  largest relative difference |a - b| / |a|. A ValueError if they share no logged training step."""
  losses = [{r["step"]: r["loss"] for r in _records(workdir) if r["split"] == "train"}
            for workdir in (workdir_a, workdir_b)]
  steps = sorted(losses[0].keys() & losses[1].keys())
  if not steps:
    raise ValueError(f"twins: expected runs with logged training steps in common, got {str(workdir_a)!r} and "
                     f"{str(workdir_b)!r}")
  differing = [t for t in steps if losses[0][t] != losses[1][t]]
  relative = max(abs(losses[0][t] - losses[1][t]) / max(abs(losses[0][t]), 1e-30) for t in steps)
  return {"steps_compared": len(steps), "first_differing_step": differing[0] if differing else None,
          "max_relative_loss_difference": relative}


def format_twins(pairs):
  """Markdown: one line per (row_a, row_b, twin_difference) of summarize_run rows."""
  rows = [{"run": a["run"], "twin": b["run"], "steps": d["steps_compared"],
           "first": "none (identical)" if d["first_differing_step"] is None else d["first_differing_step"],
           "difference": d["max_relative_loss_difference"], "accuracy": (a["eval_accuracy"], b["eval_accuracy"]),
           "tokens_per_s": (a["train_tokens_per_s"], b["train_tokens_per_s"])} for a, b, d in pairs]
  return table([Column("run", "run"), Column("twin", "twin"), Column("steps compared", "steps", "d"),
                Column("first step differing", "first", "d"),
                Column("max relative loss difference", "difference", ".1e"), Column("eval acc", "accuracy", ".4f"),
                Column("train tok/s", "tokens_per_s", ",.0f")], rows)


def format_table(rows):
  return table([Column("run", "run"), Column("pattern", "pattern"), Column("mixer", "mixer"), Column("impl", "impl"),
                Column("width x layers", lambda r: f"{r['width']} x {r['layers']}"), Column("steps", "steps", "d"),
                Column("eval acc", "eval_accuracy", ".4f"), Column("best eval acc", "best_eval_accuracy", ".4f"),
                Column("eval loss", "eval_loss", ".4f"), Column("train tok/s", "train_tokens_per_s", ",.0f")], rows)


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
