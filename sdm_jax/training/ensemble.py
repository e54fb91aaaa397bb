"""Runs that differ only in their seed, trained in lockstep: one vmapped step for all of them.

A small model (the recall studies' two layers of width 128) leaves a GPU idle between its many small launches, and
runs sharing a card in separate processes take turns at it. Runs of one config that differ in `seed` and
`data.seed` alone (a sweep point's replicates, `sweep.seeded`) have the same structure: their parameters, optimizer
states and batches stack on a leading axis, and `steps.EnsembleStep` vmaps the train step over it, so M runs cost
one run's launches.

Each run's directory ends as `loop.train` leaves it (config.json, metrics.jsonl, checkpoints, metrics.png), with the
losses of training it alone up to the rounding of batched products, so `sweep.run_one` evaluates it and `loop.train`
resumes it. As in `loop.train`: the configs and workdirs are checked before anything is written; the windowed means
are logged every log_every steps, prefixed with the run's directory name; evaluations every eval_every steps; a
checkpoint only of finite arrays; train.stop_at_accuracy ends a run at the evaluation that reaches it (its records
and checkpoints end there, its arrays go on being stepped with the others, unsaved); SIGINT / SIGTERM stop every run
at the next step boundary with its checkpoint (TrainingInterrupted); unreadable data stops them all
(TrainingDataError). A run whose loss, gradient norm or arrays turn non-finite ends alone, its last good checkpoint
kept, with the TrainingDiverged `loop.train` would raise as its outcome. One device and process; no profiles.
"""

import dataclasses
import pathlib
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp

from sdm_jax.data import DataError, make_dataset, make_iterator
from sdm_jax.models import count_params
from sdm_jax.models.loss import LOSS_CHUNK_TOKENS
from sdm_jax.models.sharding import make_mesh
from sdm_jax.training import loop
from sdm_jax.training import workdir as run_dir
from sdm_jax.training.checkpoint import Checkpointer
from sdm_jax.training.config import check_config
from sdm_jax.training.metrics import MetricsLog, Progress, metric_writers
from sdm_jax.training.optimizer import make_optimizer
from sdm_jax.training.steps import EnsembleStep

SEED_FIELDS = (("seed",), ("data", "seed"))


def check_members(configs, workdirs):
  """ValueError unless configs and workdirs pair up (at least one, distinct workdirs) and the configs differ in
  `seed` and `data.seed` alone."""
  if not configs or len(configs) != len(workdirs):
    raise ValueError(f"configs, workdirs: expected one workdir per config, at least one, got {len(configs)} configs "
                     f"and {len(workdirs)} workdirs")
  if len({pathlib.Path(w).absolute() for w in workdirs}) != len(workdirs):
    raise ValueError(f"workdirs: expected distinct directories, got {[str(w) for w in workdirs]}")

  def unseeded(config):
    flat = config.to_dict()
    for path in SEED_FIELDS:
      parent = flat
      for key in path[:-1]:
        parent = parent.get(key, {})
      parent.pop(path[-1], None)
    return flat

  first = unseeded(configs[0])
  for workdir, config in zip(workdirs[1:], configs[1:]):
    if unseeded(config) != first:
      raise ValueError(f"configs: expected configs that differ in seed and data.seed alone; {workdir}'s differs from "
                       f"{workdirs[0]}'s in more")


@dataclasses.dataclass
class _Member:
  """One run of the ensemble and what train() keeps for it."""
  config: Any
  workdir: pathlib.Path
  model: Any = None
  optimizer: Any = None
  iterator: Any = None
  checkpoints: Any = None
  metrics_log: Any = None
  progress: Any = None
  step: int = 0
  logged: int = 0
  window: list = dataclasses.field(default_factory=list)
  reached: Optional[int] = None
  outcome: Any = None  # None while it trains; then its final step or the exception that ended it

  def log(self, log, line):
    log(f"[{self.workdir.parent.name}/{self.workdir.name}] {line}")


def train_ensemble(configs, workdirs, *, log=print):
  """Trains runs of one model that differ in their seeds alone (`check_members`) to their train.steps in lockstep.

  Every run resumes from its newest checkpoint; a run that already ended (its steps, or its target accuracy) is
  left as it is, and the others must resume from one step (else ValueError: train them alone). Returns {workdir: the
  run's final step, or the TrainingDiverged that ended it}.
  """
  check_members(configs, workdirs)
  if jax.device_count() != 1 or jax.process_count() != 1:
    raise ValueError(f"train_ensemble: expected one device in one process (the members share it), got "
                     f"{jax.device_count()} devices in {jax.process_count()} processes")
  members = [_Member(config, pathlib.Path(w)) for config, w in zip(configs, workdirs)]
  for m in members:
    check_config(m.config, device_count=1)
    run_dir.check_start(m.workdir, m.config, resume=True)
  mesh = make_mesh()
  for m in members:
    m.model = loop.build(m.config, mesh)
    m.optimizer = make_optimizer(m.model, m.config.train)
    m.iterator = make_iterator(m.config, "train")
    make_dataset(m.config, "validation")  # its errors too come before anything is written
  for m in members:
    run_dir.start(m.workdir, m.config)
    m.checkpoints = Checkpointer(m.workdir, keep=m.config.train.keep_checkpoints)
    m.metrics_log = MetricsLog(m.workdir, writers=metric_writers(m.workdir, m.config, log))
  config = configs[0]
  log(f"ensemble of {len(members)} runs: {count_params(members[0].model):,} parameters each; pattern "
      f"{config.model.pattern!r}, mixer {config.model.mixer}, impl {config.model.impl}")
  with loop.StopSignals() as stop:
    stop.data_error = None
    try:
      _restore(members, log)
      active = [m for m in members if m.outcome is None]
      if active:
        _train(active, mesh, stop, log)
    finally:
      for m in members:
        m.checkpoints.close()
        m.metrics_log.close()
        loop._plot(m.metrics_log, m.workdir / "metrics.png", log)
  return {str(m.workdir): m.outcome for m in members}


def _restore(members, log):
  """Each member's newest checkpoint restored; a member that ended is given its final step as outcome."""
  for m in members:
    try:
      m.step = m.checkpoints.restore(m.model, m.optimizer, m.iterator, config=m.config) or 0
    except DataError as error:
      raise loop.TrainingDataError(f"{m.workdir}: {error}; nothing was trained. "
                                   f"{loop._last_good(m.checkpoints)}") from None
    m.metrics_log.truncate(m.step)
    m.logged = m.step
    m.reached = loop.target_step(m.metrics_log.read(), m.config.train.get("stop_at_accuracy", 0.0))
    if m.reached is not None or m.step >= m.config.train.steps:
      m.outcome = m.step
      m.log(log, f"ended at step {m.step} already")
    elif m.step:
      m.log(log, f"resumed from step {m.step}")
  steps = {m.step for m in members if m.outcome is None}
  if len(steps) > 1:
    raise ValueError(f"workdirs: the runs still to train resume from different steps "
                     f"{ {str(m.workdir): m.step for m in members if m.outcome is None} }: train them alone")


def _train(members, mesh, stop, log):
  train_cfg = members[0].config.train
  step, last = members[0].step, train_cfg.steps
  target = train_cfg.get("stop_at_accuracy", 0.0)
  tokens_per_step = members[0].config.data.batch_size * members[0].config.data.seq_len
  for m in members:
    m.progress = Progress(step, last)
  step_fn = EnsembleStep([m.model for m in members], [m.optimizer for m in members],
                         loss_chunk_tokens=train_cfg.get("loss_chunk_tokens", LOSS_CHUNK_TOKENS),
                         gradient_accumulation_steps=train_cfg.get("gradient_accumulation_steps", 1))
  streams = [loop.prefetch_to_device(m.iterator, mesh, last - step, stop=stop) for m in members]
  pending = []
  for pulled in zip(*streams):
    metrics = step_fn(jax.tree.map(lambda *batches: jnp.stack(batches), *[batch for batch, _ in pulled]))
    step += 1
    pending.append((step, metrics))
    if len(pending) > 1:
      jax.block_until_ready(pending[-2][1])
    stopping = stop.requested(step, train_cfg.log_every)
    log_now, eval_now, save_now = loop.due(step, train_cfg, last, stopping)
    if not (log_now or eval_now or save_now):
      continue
    fetched = list(zip([s for s, _ in pending], jax.device_get([m for _, m in pending])))
    pending.clear()
    if eval_now or save_now:
      step_fn.sync()
    for i, m in enumerate(members):
      if m.outcome is not None:
        continue
      pause = time.perf_counter()
      _member_step(m, step, last, [(s, {k: v[i] for k, v in values.items()}) for s, values in fetched], pulled[i][1],
                   mesh, target, tokens_per_step, log_now, eval_now, save_now, log)
      m.progress.exclude(time.perf_counter() - pause)
    if stopping and stop.data_error is not None:
      raise loop.TrainingDataError(f"{stop.data_error}; stopped at step {step}")
    if stopping and step < last:
      raise loop.TrainingInterrupted(stop.signum, step, step, "each run's checkpoints")
    if all(m.outcome is not None for m in members):
      break
  if stop.data_error is not None:
    raise loop.TrainingDataError(f"{stop.data_error}; stopped at step {step}")


def _member_step(m, step, last, fetched, data_state, mesh, target, tokens_per_step, log_now, eval_now, save_now,
                 log):
  """One member's part of a log, eval or checkpoint step; sets m.outcome when the member ends here."""
  member_log = lambda line: m.log(log, line)
  try:
    loop._check_finite(fetched, m.checkpoints)
  except loop.TrainingDiverged as error:
    m.outcome = error
    member_log(f"stopped: {error}")
    return
  m.window += [metrics for _, metrics in fetched]
  if log_now:
    m.logged = loop._log_window(m.window, step, m.logged, m.progress, tokens_per_step, m.metrics_log, member_log)
  if eval_now and loop.evaluate_at(step, m.model, m.config, mesh, m.metrics_log, target, member_log):
    m.reached = step
    if m.window:
      m.logged = loop._log_window(m.window, step, m.logged, m.progress, tokens_per_step, m.metrics_log, member_log)
    save_now = True
  if save_now:
    try:
      loop.save_finite(m.checkpoints, step, m.model, m.optimizer, data_state, m.config)
    except loop.TrainingDiverged as error:
      m.outcome = error
      member_log(f"stopped: {error}")
      return
  if m.reached is not None or step == last:
    m.outcome = step
