"""The training program, top to bottom: model, optimizer, mesh, data, resume, steps, eval, checkpoints."""

import collections
import contextlib
import os
import pathlib
import signal
import threading
import time

import jax
import numpy as np
from flax import nnx

from sdm_jax.data import DataError, make_dataset, make_iterator
from sdm_jax.evaluation.lm_eval import evaluate
from sdm_jax.models import LanguageModel, count_params
from sdm_jax.models.loss import LOSS_CHUNK_TOKENS
from sdm_jax.models.sharding import global_batch, make_mesh, place_state
from sdm_jax.training import workdir as run_dir
from sdm_jax.training.checkpoint import Checkpointer, NonFiniteState
from sdm_jax.training.config import check_config, parse_profile_steps
from sdm_jax.training.metrics import MetricsLog, Progress, StepProfiler, metric_writers, plot_metrics, window_means
from sdm_jax.training.optimizer import make_optimizer
from sdm_jax.training.steps import TrainStep
from sdm_jax.training.workdir import load_config  # noqa: F401 (the run's config, for eval and generate)


class TrainingDiverged(RuntimeError):
  """A loss, gradient norm or parameter became non-finite; nothing was saved from that state, the last good
  checkpoint is left as it was."""


class TrainingInterrupted(Exception):
  """SIGINT or SIGTERM stopped the run at a step boundary; `step` is where it stopped, `checkpoint` the newest
  checkpoint (saved at `step` when its metrics were finite)."""

  def __init__(self, signum, step, checkpoint, directory):
    self.signum, self.step, self.checkpoint = signum, step, checkpoint
    super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}; the newest checkpoint is step "
                     f"{checkpoint} in {directory}")


class TrainingDataError(ValueError):
  """The training data could not be read (a damaged shard, named); the run stopped at a step boundary with a
  checkpoint where batches were already read, else at its last checkpoint."""


class StopSignals:
  """Within the context, the first SIGINT or SIGTERM sets `signum` instead of interrupting, and the program stops
  at its next step boundary (a training run, or a sweep's running run and then the sweep). A second signal ends
  the process at once: one line on stderr and exit code 128 + signum through os._exit, because a KeyboardInterrupt
  raised inside native code (a jitted step, orbax's writer threads) can end in `Fatal Python error: Aborted`; a
  checkpoint being written then is left unfinished, which orbax never lists as a step. A handler does nothing
  else: printing from one can re-enter a stream the main thread is writing (the last line is one os.write).

  Contexts nest: an inner `with StopSignals()` (train() inside a sweep) gets the outer one, so a signal that came
  between two runs stops the next at once. `forwarding(send)` passes every signal to send(signum) as well (a sweep
  to its run's process). Off the main thread (where Python delivers no signals) it installs nothing."""

  SIGNALS = (signal.SIGINT, signal.SIGTERM)
  _active = None  # the outermost context on the main thread

  def __init__(self):
    self.signum, self.previous, self.forwards, self.nested = None, {}, [], False
    self.data_error = None

  def __enter__(self):
    if StopSignals._active is not None:
      self.nested = True
      return StopSignals._active
    if threading.current_thread() is threading.main_thread():
      self.previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
      StopSignals._active = self
    return self

  def _handle(self, signum, frame):
    del frame
    for send in list(self.forwards):
      send(signum)
    if self.signum is None:
      self.signum = signum
      return
    os.write(2, f"\n{signal.Signals(signum).name} again: stopped at once, without saving; the newest checkpoint "
                f"is kept\n".encode())
    os._exit(128 + signum)

  @contextlib.contextmanager
  def forwarding(self, send):
    """Within the context, every signal is also passed to send(signum)."""
    self.forwards.append(send)
    try:
      yield
    finally:
      self.forwards.remove(send)

  def __exit__(self, *exc):
    if self.nested or StopSignals._active is not self:
      return
    for signum, handler in self.previous.items():
      signal.signal(signum, handler)
    self.previous, StopSignals._active = {}, None

  def requested(self, step, every):
    """Whether to stop after `step`. In one process: once signalled. In a multi-process run a signal may reach
    some processes only, or at different steps, and a process that stopped alone would leave the others waiting
    in a collective: they agree, at every multiple of `every` steps, to stop when any of them was signalled. Data
    that cannot be read (`data_error`) stops every process at once: each reads every document (sdm_jax.data.corpus),
    so all meet it at the same batch."""
    if self.data_error is not None:
      return True
    if jax.process_count() == 1:
      return self.signum is not None
    if step % every:
      return False
    from jax.experimental import multihost_utils
    signalled = int(np.max(multihost_utils.process_allgather(np.int32(self.signum or 0))))
    self.signum = self.signum or signalled or None
    return bool(signalled)


def build(config, mesh):
  model = LanguageModel(config.model, rngs=nnx.Rngs(config.seed))
  place_state(model, mesh, config.train.fsdp)
  return model


def prefetch_to_device(iterator, mesh, count, ahead=2, stop=None):
  """Yields `count` (global batch, iterator state right after pulling it) pairs, `ahead` batches in advance.

  Pulling (and the host-to-device copy) happens while the steps already dispatched run on the device. The state
  travels with its batch so that a checkpoint saves the state of the batch consumed, not of the ones prefetched.
  Data that cannot be read (DataError: a damaged shard) sets stop.data_error (raises without `stop`) and yields the
  batches still queued, so the run stops at the next step boundary with a checkpoint, or where it started.
  """
  queue, pulled = collections.deque(), 0
  while queue or pulled < count:
    while pulled < count and len(queue) <= ahead:
      try:
        batch = global_batch(next(iterator), mesh)
      except DataError as error:
        if stop is None:
          raise
        stop.data_error, pulled = error, count
        break
      queue.append((batch, iterator.get_state()))
      pulled += 1
    if queue:
      yield queue.popleft()


def _last_good(checkpoints):
  latest = checkpoints.latest_step()
  if latest is None:
    return "There is no checkpoint to resume from (none was saved yet)"
  return f"The last good checkpoint is step {latest} in {checkpoints.directory}"


def _check_finite(fetched, checkpoints):
  """Raises TrainingDiverged at the first (step, metrics) pair whose loss or gradient norm is non-finite."""
  for step, metrics in fetched:
    bad = [f"{key} ({float(metrics[key])})" for key in ("loss", "grad_norm") if not np.isfinite(float(metrics[key]))]
    if bad:
      raise TrainingDiverged(f"non-finite {' and '.join(bad)} at step {step}; stopped without saving. "
                             f"{_last_good(checkpoints)}")


def _log_window(window, step, logged, progress, tokens_per_step, metrics_log, log):
  """Logs the means of the training metrics in `window` (then emptied) at `step`; returns step (the last logged)."""
  record = {"split": "train", "step": step, **window_means(window)}
  window.clear()
  log(progress.line(step, record, tokens_per_step * (step - logged)))
  if progress.tokens_per_s is not None:
    record["tokens_per_s"] = progress.tokens_per_s
  metrics_log.write(record)
  return step


def _plot(metrics_log, path, log):
  try:
    plot_metrics(metrics_log.read(), path)
  except Exception as error:  # a plot is not worth hiding why the run stopped
    log(f"warning: could not plot {path} ({type(error).__name__}: {error})")


def due(step, train_cfg, last, stopping):
  """(log, evaluate, save) after `step`: every log_every / eval_every / checkpoint_every steps; the evaluation also
  at train.steps; the log and a checkpoint also at this call's last step and when stopping."""
  return (step % train_cfg.log_every == 0 or step == last or stopping,
          step % train_cfg.eval_every == 0 or step == train_cfg.steps,
          step % train_cfg.checkpoint_every == 0 or step == last or stopping)


def evaluate_at(step, model, config, mesh, metrics_log, target, log):
  """Evaluates the model after `step` (recorded in metrics_log and logged); returns whether its accuracy reached
  `target` (train.stop_at_accuracy; 0: never), which ends the run there."""
  result = evaluate(model, config, mesh)
  metrics_log.write({"split": "eval", "step": step, **result})
  log(f"eval at step {step}: loss {result['loss']:.4f} accuracy {result['accuracy']:.4f}")
  reached = bool(target) and result["accuracy"] >= target
  if reached:
    log(f"accuracy {result['accuracy']:.4f} reached train.stop_at_accuracy = {target} at step {step}: "
        f"the run ends here")
  return reached


def save_finite(checkpoints, step, model, optimizer, data_state, config):
  """checkpoints.save, a non-finite state's refusal raised as TrainingDiverged naming the last good checkpoint."""
  try:
    checkpoints.save(step, model, optimizer, data_state, config)
  except NonFiniteState as error:
    raise TrainingDiverged(f"non-finite state after step {step} ({error}); stopped without saving. "
                           f"{_last_good(checkpoints)}") from None


def target_step(records, target):
  """The step of the first evaluation record (metrics.jsonl's split "eval") whose accuracy reaches `target`, or None
  (also for target 0: nothing is looked for)."""
  if not target:
    return None
  return min((r["step"] for r in records if r.get("split") == "eval" and r.get("accuracy", -1.0) >= target),
             default=None)


def final_step(workdir, train_config):
  """The step a run of `train_config` (the run's config.train, a ConfigDict or a dict) ends at in workdir: its first
  evaluation that reached train.stop_at_accuracy, else train.steps (also for a config saved before that field)."""
  target = train_config.get("stop_at_accuracy", 0.0)
  reached = target_step(MetricsLog(workdir, writes=False).read(), target) if target else None
  return train_config["steps"] if reached is None else reached


def train(config, workdir, *, resume=True, overwrite=False, stop_after=None, log=print):
  """Trains to config.train.steps (or `stop_after` more steps of this call); returns the final step.

  Before anything is written to workdir the config is checked (`config.check_config`: ConfigError), the workdir
  may be used as asked (`workdir.check_start`: WorkdirError; overwrite starts afresh), and the model, optimizer
  and data are built. Steps are dispatched without waiting for them: their metrics stay on the device until a
  log, eval or checkpoint step, where they come back together and every loss and gradient norm since the last
  such step is checked, and a checkpoint is saved only from a state whose arrays are all finite; otherwise
  TrainingDiverged. An evaluation whose accuracy reaches train.stop_at_accuracy (when set) ends the run there, with a
  checkpoint: the run's final step (`final_step`); a call on a run that already did returns at once. SIGINT / SIGTERM
  stop the run at the next step boundary, save a checkpoint there (its metrics finite) and raise TrainingInterrupted
  (in a multi-process run, all processes at the next multiple of log_every steps, whichever of them was signalled:
  `StopSignals.requested`). The plot is written however the run ends.
The logged training metrics are their means over the steps since the last log; the records go to metrics.jsonl,
TensorBoard and W&B (`metrics.metric_writers`); train.profile_steps are traced (`metrics.StepProfiler`).
  """
  workdir = pathlib.Path(workdir)
  check_config(config, device_count=jax.device_count())
  run_dir.check_start(workdir, config, resume=resume, overwrite=overwrite)
  train_cfg = config.train
  mesh = make_mesh()
  model = build(config, mesh)
  optimizer = make_optimizer(model, train_cfg)
  place_state(optimizer, mesh, train_cfg.fsdp)
  shard = dict(shard_index=jax.process_index(), shard_count=jax.process_count())
  iterator = make_iterator(config, "train", **shard)
  make_dataset(config, "validation", **shard)  # its errors too come before anything is written
  # One process of a multi-process run writes the run's own files (orbax coordinates the checkpoints itself), after
  # every process has checked the workdir as it was.
  primary = jax.process_index() == 0
  run_dir.sync_processes("workdir checked")
  if primary:
    run_dir.start(workdir, config, overwrite=overwrite)
  run_dir.sync_processes("workdir started")
  log(f"model: {count_params(model):,} parameters; pattern {config.model.pattern!r}, mixer {config.model.mixer}, "
      f"impl {config.model.impl}; {len(jax.devices())} device(s)")

  checkpoints = Checkpointer(workdir, keep=train_cfg.keep_checkpoints)
  metrics_log = MetricsLog(workdir, writes=primary, writers=metric_writers(workdir, config, log) if primary else ())
  profiler = StepProfiler(workdir, parse_profile_steps(train_cfg.get("profile_steps", "")), log)
  with StopSignals() as stop:
    stop.data_error = None  # a sweep's context outlives the run that met an error
    try:
      try:
        step = (checkpoints.restore(model, optimizer, iterator, config=config) if resume else None) or 0
      except DataError as error:  # restoring the iterator's state reads the records it had consumed
        raise TrainingDataError(f"{error}; nothing was trained. {_last_good(checkpoints)}") from None
      metrics_log.truncate(step)  # the records of steps past the checkpoint belong to a run that was lost
      if step:
        log(f"resumed from step {step} ({checkpoints.directory})")
      target = train_cfg.get("stop_at_accuracy", 0.0)
      reached = target_step(metrics_log.read(), target)
      if reached is not None:  # the target cannot change between calls, so the checkpoint restored is that step's
        log(f"the evaluation at step {reached} reached train.stop_at_accuracy = {target}: the run ended there")
      progress = Progress(step, train_cfg.steps)
      last = train_cfg.steps if stop_after is None else min(train_cfg.steps, step + stop_after)
      last = step if reached is not None else last
      tokens_per_step = config.data.batch_size * config.data.seq_len
      step_fn = TrainStep(model, optimizer, loss_chunk_tokens=train_cfg.get("loss_chunk_tokens", LOSS_CHUNK_TOKENS),
                          gradient_accumulation_steps=train_cfg.get("gradient_accumulation_steps", 1))
      pending = []  # (step, metrics of device scalars) not yet fetched
      logged, window = step, []  # window: the fetched metrics of the steps since the last log
      for batch, data_state in prefetch_to_device(iterator, mesh, last - step, stop=stop):
        with profiler.step(step + 1):
          metrics = step_fn(batch)
        step += 1
        profiler.finish(step, metrics)
        pending.append((step, metrics))
        if len(pending) > 1:  # two steps in flight at most, so a stop waits for them, not for every step queued
          jax.block_until_ready(pending[-2][1])
        stopping = stop.requested(step, train_cfg.log_every)
        log_now, eval_now, save_now = due(step, train_cfg, last, stopping)
        if not (log_now or eval_now or save_now):
          continue
        fetched = list(zip([s for s, _ in pending], jax.device_get([m for _, m in pending])))
        pending.clear()
        _check_finite(fetched, checkpoints)
        window += [metrics for _, metrics in fetched]
        if log_now:
          logged = _log_window(window, step, logged, progress, tokens_per_step, metrics_log, log)
        if eval_now or save_now:
          step_fn.sync()  # the model and optimizer hold donated arrays until now
        pause = time.perf_counter()
        if eval_now and evaluate_at(step, model, config, mesh, metrics_log, target, log):
          reached = step
          if window:  # the steps since the last log are this run's last
            logged = _log_window(window, step, logged, progress, tokens_per_step, metrics_log, log)
          save_now = True
        if save_now:
          save_finite(checkpoints, step, model, optimizer, data_state, config)
        progress.exclude(time.perf_counter() - pause)
        if stopping and stop.data_error is not None:
          raise TrainingDataError(f"{stop.data_error}; stopped at step {step}. {_last_good(checkpoints)}")
        if stopping and step < last:
          raise TrainingInterrupted(stop.signum, step, checkpoints.latest_step(), checkpoints.directory)
        if reached is not None:
          break
      if stop.data_error is not None:  # met at this call's first batch: nothing trained since the checkpoint
        raise TrainingDataError(f"{stop.data_error}; stopped at step {step}. {_last_good(checkpoints)}")
    finally:
      checkpoints.close()
      profiler.close()
      metrics_log.close()
      if primary:
        _plot(metrics_log, workdir / "metrics.png", log)
  return step


def restore_for_eval(workdir, config):
  """Builds the model of a run and restores its newest checkpoint that passes the checks (a failing one is skipped
  and left where it is); returns (model, step, mesh)."""
  mesh = make_mesh()
  model = build(config, mesh)
  checkpoints = Checkpointer(workdir)
  try:
    step = checkpoints.restore(model, config=config, move_damaged=False)
  finally:
    checkpoints.close()
  if step is None:
    raise run_dir.WorkdirError(f"workdir: no checkpoint under {checkpoints.directory} reads and passes the checks")
  return model, step, mesh
