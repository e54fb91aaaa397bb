"""The training program, top to bottom: model, optimizer, mesh, data, resume, steps, eval, checkpoints."""

import collections
import json
import pathlib
import time

import jax
import numpy as np
from flax import nnx

from sdm_jax.data import make_iterator
from sdm_jax.evaluation.lm_eval import evaluate
from sdm_jax.models import LanguageModel, count_params
from sdm_jax.models.loss import LOSS_CHUNK_TOKENS
from sdm_jax.models.sharding import global_batch, make_mesh, place_state
from sdm_jax.training.checkpoint import Checkpointer
from sdm_jax.training.metrics import MetricsLog, Progress, plot_metrics
from sdm_jax.training.optimizer import make_optimizer
from sdm_jax.training.steps import TrainStep


class TrainingDiverged(RuntimeError):
  """The loss became non-finite; the last good checkpoint is left as it was."""


def build(config, mesh):
  model = LanguageModel(config.model, rngs=nnx.Rngs(config.seed))
  place_state(model, mesh, config.train.fsdp)
  return model


def prefetch_to_device(iterator, mesh, count, ahead=2):
  """Yields `count` (global batch, iterator state right after pulling it) pairs, `ahead` batches in advance.

  Pulling (and the host-to-device copy) happens while the steps already dispatched run on the device. The state
  travels with its batch so that a checkpoint saves the state of the batch consumed, not of the ones prefetched.
  """
  queue, pulled = collections.deque(), 0
  while queue or pulled < count:
    while pulled < count and len(queue) <= ahead:
      batch = global_batch(next(iterator), mesh)
      queue.append((batch, iterator.get_state()))
      pulled += 1
    yield queue.popleft()


def _check_finite(fetched, checkpoints):
  """Raises TrainingDiverged at the first (step, metrics) pair whose loss is non-finite."""
  for step, metrics in fetched:
    loss = float(metrics["loss"])
    if not np.isfinite(loss):
      raise TrainingDiverged(
          f"non-finite loss ({loss}) at step {step}; stopped without saving. The last good checkpoint is step "
          f"{checkpoints.latest_step()} in {checkpoints.directory}")


def train(config, workdir, *, resume=True, stop_after=None, log=print):
  """Trains to config.train.steps (or `stop_after` more steps of this call); returns the final step.

  Steps are dispatched without waiting for them: their metrics stay on the device until a log, eval or checkpoint
  step, where they come back together and every loss since the last such step is checked, so that nothing is
  evaluated or saved from a state that followed a non-finite loss.
  """
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
  train_cfg = config.train
  mesh = make_mesh()
  model = build(config, mesh)
  optimizer = make_optimizer(model, train_cfg)
  place_state(optimizer, mesh, train_cfg.fsdp)
  log(f"model: {count_params(model):,} parameters; pattern {config.model.pattern!r}, mixer {config.model.mixer}, "
      f"impl {config.model.impl}; {len(jax.devices())} device(s)")

  iterator = make_iterator(config, "train", shard_index=jax.process_index(), shard_count=jax.process_count())
  checkpoints = Checkpointer(workdir, keep=train_cfg.keep_checkpoints)
  step = (checkpoints.restore(model, optimizer, iterator) if resume else None) or 0
  if step:
    log(f"resumed from step {step} ({checkpoints.directory})")
  metrics_log = MetricsLog(workdir)
  progress = Progress(step, train_cfg.steps)
  last = train_cfg.steps if stop_after is None else min(train_cfg.steps, step + stop_after)
  tokens_per_step = config.data.batch_size * config.data.seq_len
  step_fn = TrainStep(model, optimizer, loss_chunk_tokens=train_cfg.get("loss_chunk_tokens", LOSS_CHUNK_TOKENS))
  pending = []  # (step, metrics of device scalars) not yet fetched

  try:
    for batch, data_state in prefetch_to_device(iterator, mesh, last - step):
      metrics = step_fn(batch)
      step += 1
      pending.append((step, metrics))
      log_now = step % train_cfg.log_every == 0 or step == last
      eval_now = step % train_cfg.eval_every == 0 or step == train_cfg.steps
      save_now = step % train_cfg.checkpoint_every == 0 or step == last
      if not (log_now or eval_now or save_now):
        continue
      fetched = list(zip([s for s, _ in pending], jax.device_get([m for _, m in pending])))
      pending.clear()
      _check_finite(fetched, checkpoints)
      if log_now:
        record = {"split": "train", "step": step, **{k: float(v) for k, v in fetched[-1][1].items()}}
        log(progress.line(step, record, tokens_per_step * train_cfg.log_every))
        if progress.tokens_per_s is not None:
          record["tokens_per_s"] = progress.tokens_per_s
        metrics_log.write(record)
      if eval_now or save_now:
        step_fn.sync()  # the model and optimizer hold donated arrays until now
      pause = time.perf_counter()
      if eval_now:
        result = evaluate(model, config, mesh)
        metrics_log.write({"split": "eval", "step": step, **result})
        log(f"eval at step {step}: loss {result['loss']:.4f} accuracy {result['accuracy']:.4f}")
      if save_now:
        checkpoints.save(step, model, optimizer, data_state, config)
      progress.exclude(time.perf_counter() - pause)
  finally:
    checkpoints.close()

  plot_metrics(metrics_log.read(), workdir / "metrics.png")
  return step


def restore_for_eval(workdir, config):
  """Builds the model of a run and restores its newest readable checkpoint; returns (model, step, mesh)."""
  mesh = make_mesh()
  model = build(config, mesh)
  checkpoints = Checkpointer(workdir)
  step = checkpoints.restore(model)
  checkpoints.close()
  if step is None:
    raise FileNotFoundError(f"no readable checkpoint under {checkpoints.directory}")
  return model, step, mesh


def load_config(workdir):
  import ml_collections
  return ml_collections.ConfigDict(json.loads((pathlib.Path(workdir) / "config.json").read_text()))
