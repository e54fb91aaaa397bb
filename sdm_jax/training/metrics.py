"""Run metrics: a JSONL log, a progress line with tokens/s and ETA, and loss/accuracy plots."""

import json
import pathlib
import time

from sdm_jax import jsonio


class MetricsLog:
  """Appends one JSON object per record to <workdir>/metrics.jsonl (kept across resumes). writes=False (every
  process of a multi-process run but the first): write and truncate do nothing, so one process keeps the file."""

  def __init__(self, workdir, *, writes=True):
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self.writes = writes
    if writes:
      self.path.parent.mkdir(parents=True, exist_ok=True)

  def write(self, record):
    if not self.writes:
      return
    with self.path.open("a") as f:
      f.write(jsonio.dumps(record) + "\n")

  def truncate(self, step):
    """Drops the records after `step` (those of a run's steps past the checkpoint it resumes from), so that a resumed
    run logs each step once."""
    if not self.writes or not self.path.exists():
      return
    lines = self.path.read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
    if len(kept) != len(lines):
      jsonio.replace_text(self.path, "".join(line + "\n" for line in kept))

  def read(self):
    if not self.path.exists():
      return []
    return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


class Progress:
  """Training tokens/s and ETA from wall time since the first logged step of this process, pauses left out."""

  def __init__(self, start_step, total_steps):
    self.start_step, self.total_steps = start_step, total_steps
    self.start_time, self.tokens = None, 0.0
    self.tokens_per_s = None  # since the end of the first logged step: compilation left out

  def exclude(self, seconds):
    """Leaves `seconds` of wall time (evaluation, checkpointing) out of tokens/s and the ETA's rate."""
    if self.start_time is not None:
      self.start_time += seconds

  def line(self, step, metrics, tokens):
    now = time.perf_counter()
    if self.start_time is None:  # the first step includes compilation; time from its end
      self.start_time, self.first_step = now, step
      return f"step {step}/{self.total_steps} loss {metrics['loss']:.4f} acc {metrics['accuracy']:.3f} (compiled)"
    self.tokens += tokens
    elapsed = now - self.start_time
    rate = self.tokens / max(elapsed, 1e-9)
    self.tokens_per_s = rate
    steps_per_s = (step - self.first_step) / max(elapsed, 1e-9)
    eta = (self.total_steps - step) / max(steps_per_s, 1e-9)
    return (f"step {step}/{self.total_steps} loss {metrics['loss']:.4f} acc {metrics['accuracy']:.3f} "
            f"{rate:,.0f} tok/s ETA {eta:.0f}s")


def plot_metrics(records, path):
  """Loss and accuracy against step, train and eval, as a PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for split in ("train", "eval"):
    rows = [r for r in records if r.get("split") == split]
    if not rows:
      continue
    steps = [r["step"] for r in rows]
    for ax, key in zip(axes, ("loss", "accuracy")):
      values = [float("nan") if r.get(key) is None else r[key] for r in rows]  # null: a non-finite value
      ax.plot(steps, values, marker="o" if split == "eval" else None, label=split)
  for ax, key in zip(axes, ("loss", "accuracy")):
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a run stopped before its first record has nothing to label
      ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
