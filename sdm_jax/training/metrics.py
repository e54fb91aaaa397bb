"""Run metrics: a JSONL log with TensorBoard and W&B beside it, the training metrics' means over each logging
window, a progress line with tokens/s and ETA, loss/accuracy plots, and a jax.profiler trace of chosen steps."""

import contextlib
import json
import numbers
import pathlib
import secrets
import time

import jax

from sdm_jax import jsonio

TENSORBOARD = "tensorboard"  # <workdir>/tensorboard: the event files
PROFILE = "profile"  # <workdir>/profile: jax.profiler traces, plugins/profile/<run>/*.xplane.pb
WANDB = "wandb"  # <workdir>/wandb: W&B's own files
WANDB_RUN_ID = "wandb_run_id"  # <workdir>/wandb_run_id: the W&B run a resumed run goes on logging to


class MetricsLog:
  """Appends one JSON object per record to <workdir>/metrics.jsonl (kept across resumes) and hands each record to
  `writers` (TensorBoardWriter, WandbWriter: `metric_writers`). writes=False (every process of a multi-process run
  but the first): write and truncate do nothing, so one process keeps the file."""

  def __init__(self, workdir, *, writes=True, writers=()):
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self.writes = writes
    self.writers = list(writers) if writes else []
    if writes:
      self.path.parent.mkdir(parents=True, exist_ok=True)

  def write(self, record):
    if not self.writes:
      return
    with self.path.open("a") as f:
      f.write(jsonio.dumps(record) + "\n")
    for writer in self.writers:
      writer.write(record)

  def truncate(self, step):
    """Drops the records after `step` (those of a run's steps past the checkpoint it resumes from), so that a resumed
    run logs each step once; the writers start at `step` too."""
    if not self.writes:
      return
    for writer in self.writers:
      writer.resume_at(step)
    if not self.path.exists():
      return
    lines = self.path.read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
    if len(kept) != len(lines):
      jsonio.replace_text(self.path, "".join(line + "\n" for line in kept))

  def read(self):
    if not self.path.exists():
      return []
    return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

  def close(self):
    for writer in self.writers:
      writer.close()
    self.writers = []


def scalars(record):
  """{"<split>/<name>": value} of a record's numbers (not its step, split, booleans or nulls)."""
  return {f"{record['split']}/{key}": float(value) for key, value in record.items()
          if key not in ("split", "step") and isinstance(value, numbers.Real) and not isinstance(value, bool)}


class TensorBoardWriter:
  """Every record's scalars (`scalars`) as TensorBoard events in <workdir>/tensorboard, at the record's step
  (tensorboardX). A run that resumes from step S starts its event file with TensorBoard's restart marker at S + 1
  (purge_step), so the steps logged past the checkpoint by the run that was lost are hidden, as metrics.jsonl drops
  them; a run started afresh marks step 1."""

  def __init__(self, workdir):
    self.directory = pathlib.Path(workdir) / TENSORBOARD
    self.start_step = 0
    self._writer = None

  def resume_at(self, step):
    self.start_step = step

  def write(self, record):
    if self._writer is None:
      from tensorboardX import SummaryWriter
      # tensorboardX names a file by the second it was opened and the host: a random suffix keeps a call within the
      # same second from writing over the file of the call before it.
      self._writer = SummaryWriter(logdir=str(self.directory), purge_step=self.start_step + 1,
                                   filename_suffix=f".{secrets.token_hex(4)}")
    for tag, value in scalars(record).items():
      self._writer.add_scalar(tag, value, global_step=record["step"])

  def close(self):
    if self._writer is not None:
      self._writer.close()
      self._writer = None


class WandbWriter:
  """Every record's scalars logged to a Weights & Biases run of `project` at the record's step. The run's id is kept
  in <workdir>/wandb_run_id, so a resumed run goes on logging to the same W&B run (W&B's resume="allow"); W&B keeps
  its own files in <workdir>/wandb."""

  def __init__(self, wandb, workdir, project, config):
    self.wandb, self.workdir, self.project, self.config = wandb, pathlib.Path(workdir), project, config
    self._run = None

  def resume_at(self, step):
    del step  # W&B drops what is logged at a step below its run's newest

  def write(self, record):
    if self._run is None:
      id_path = self.workdir / WANDB_RUN_ID
      if not id_path.is_file():
        jsonio.replace_text(id_path, secrets.token_hex(8) + "\n")
      self._run = self.wandb.init(project=self.project, id=id_path.read_text().strip(), resume="allow",
                                  name=self.workdir.resolve().name, dir=str(self.workdir), config=self.config)
    self._run.log(scalars(record), step=record["step"])

  def close(self):
    if self._run is not None:
      self._run.finish()
      self._run = None


def metric_writers(workdir, config, log=print):
  """The writers a run's records go to beside metrics.jsonl: TensorBoard always, W&B when config.train.wandb_project
  is set and wandb can be imported (where it cannot, a warning through `log`)."""
  writers = [TensorBoardWriter(workdir)]
  project = config.train.get("wandb_project", "")
  if project:
    try:
      import wandb
    except ImportError:
      log(f"warning: config.train.wandb_project is {project!r} but wandb is not installed (pip install wandb); "
          f"logging to metrics.jsonl and TensorBoard only")
    else:
      writers.append(WandbWriter(wandb, workdir, project, config.to_dict()))
  return writers


def window_means(window):
  """[metrics of each step of a logging window] (dicts of floats) -> each metric's mean over the window's steps:
  the logged training loss and accuracy are the window's, not its last step's."""
  if not window:
    raise ValueError("window: expected the metrics of at least one step, got none")
  return {key: sum(float(metrics[key]) for metrics in window) / len(window) for key in window[0]}


class StepProfiler:
  """A jax.profiler trace of the training steps first..last (`config.parse_profile_steps` of train.profile_steps) in
  <workdir>/profile, for TensorBoard's profile plugin or xprof; each traced step is a StepTraceAnnotation "train"
  with its step number. A run resumed past `first` traces from its first step up to `last`. profile_steps None: does
  nothing."""

  def __init__(self, workdir, profile_steps, log=print):
    self.directory = pathlib.Path(workdir) / PROFILE
    self.first, self.last = profile_steps or (None, None)
    self.log, self.tracing = log, False

  @contextlib.contextmanager
  def step(self, step):
    """Around the dispatch of training step `step` (1-based): starts the trace at the first step to trace."""
    if self.first is None or not self.first <= step <= self.last:
      yield
      return
    if not self.tracing:
      jax.profiler.start_trace(str(self.directory))
      self.tracing, self.started = True, step
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
      yield

  def finish(self, step, metrics):
    """After step `step` was dispatched (its metrics not yet fetched): at the last step to trace, waits for it to
    run and writes the trace."""
    if self.tracing and step >= self.last:
      jax.block_until_ready(metrics)
      self.close()
      self.log(f"profile of steps {self.started}-{step} in {self.directory}")

  def close(self):
    if self.tracing:
      jax.profiler.stop_trace()
      self.tracing = False


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
