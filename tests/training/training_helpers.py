"""What the training tests share: tiny configs of the demo recall task, a run's train losses and its checkpoints read
back as host values."""

import pathlib

import jax
import numpy as np
import orbax.checkpoint as ocp

from experiments.configs.mqar import get_config
from sdm_jax.training.metrics import MetricsLog


def tiny_config(steps=6):
  config = get_config("demo")
  config.data.seq_len, config.data.batch_size = 32, 4
  config.data.num_kv_pairs = config.data.num_queries = 4
  config.model.width, config.model.num_layers = 32, 1
  config.train.steps, config.train.warmup_steps = steps, 2
  config.train.log_every, config.train.eval_every, config.train.checkpoint_every = 1, 1000, 2
  config.train.eval_batches = 1
  return config


def attention_config(steps):
  # The loop's tests don't depend on the mixer; full attention compiles several times faster than chunked GDN-2.
  config = tiny_config(steps)
  config.model.pattern = "A"
  return config


def train_losses(workdir):
  return {r["step"]: r["loss"] for r in MetricsLog(workdir).read() if r["split"] == "train"}


def checkpoint_contents(workdir):
  """{step: {"model", "optimizer", "data", "meta"}} of every checkpoint of a run, as host arrays and JSON."""
  manager = ocp.CheckpointManager(pathlib.Path(workdir).resolve() / "checkpoints")
  contents = {}
  for step in manager.all_steps():
    restored = manager.restore(step, args=ocp.args.Composite(
        model=ocp.args.StandardRestore(), optimizer=ocp.args.StandardRestore(), data=ocp.args.JsonRestore(),
        meta=ocp.args.JsonRestore()))
    contents[step] = {key: jax.device_get(restored[key]) for key in ("model", "optimizer", "data", "meta")}
  manager.close()
  return contents


def assert_same_checkpoints(got, expected):
  assert sorted(got) == sorted(expected)
  for step in expected:
    assert got[step]["data"] == expected[step]["data"], step
    assert got[step]["meta"] == expected[step]["meta"], step
    for key in ("model", "optimizer"):
      jax.tree.map(np.testing.assert_array_equal, got[step][key], expected[step][key])
