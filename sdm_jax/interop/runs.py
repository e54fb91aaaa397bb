"""Run directories from and to other checkpoints: what `experiments.convert` writes and reads."""

import pathlib

import jax
from flax import nnx

from sdm_jax.data import make_iterator
from sdm_jax.interop.fla import load_fla, save_fla
from sdm_jax.models.sharding import make_mesh
from sdm_jax.training import workdir as run_dir
from sdm_jax.training.checkpoint import Checkpointer
from sdm_jax.training.config import check_config
from sdm_jax.training.loop import build, restore_for_eval
from sdm_jax.training.optimizer import make_optimizer


def run_from_fla(fla_dir, config, workdir, *, overwrite=False):
  """Writes workdir as a run at step 0 whose model is the fla checkpoint in fla_dir: config.json (`config`, its
  model replaced by the checkpoint's; dtype, impl, chunk_size and remat kept) and a checkpoint with that model, a
  fresh optimizer and the data iterator's start, which `experiments.train` resumes (fine-tuning), and
  `experiments.eval` and `generate` read. Returns the run's config."""
  fla_model, fla_model_config = load_fla(fla_dir)
  kept = {k: config.model.get(k) for k in ("dtype", "impl", "chunk_size", "remat") if k in config.model}
  config.model = fla_model_config
  for k, v in kept.items():
    config.model[k] = v
  check_config(config, device_count=jax.device_count())
  run_dir.check_start(workdir, config, resume=False, overwrite=overwrite)
  model = build(config, make_mesh())
  nnx.update(model, nnx.state(fla_model, nnx.Param))
  optimizer = make_optimizer(model, config.train)
  iterator = make_iterator(config, "train", shard_index=0, shard_count=1)
  run_dir.start(pathlib.Path(workdir), config, overwrite=overwrite)
  checkpoints = Checkpointer(workdir)
  try:
    checkpoints.save(0, model, optimizer, iterator.get_state(), config)
  finally:
    checkpoints.close()
  return config


def run_to_fla(workdir, out):
  """Writes the newest good checkpoint of the run in workdir as an fla HF directory out; returns its step."""
  config = run_dir.load_config(workdir)
  model, step, _ = restore_for_eval(workdir, config)
  save_fla(model, config.model, out)
  return step
