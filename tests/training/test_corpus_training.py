"""End to end on the machine's own text: a few stdlib modules and the pydoc topics prepared with a trained 512-token
BPE, a 1-layer width-32 model (full attention, the mixer that compiles fastest on a CPU) trained on packed rows,
stopped and resumed (the data iterator's state restored from the checkpoint), evaluated with perplexity and bits
per byte."""

import json
import math
import pathlib
import sysconfig

import numpy as np
import orbax.checkpoint as ocp
import pytest

from experiments.configs.corpus import get_config
from sdm_jax.data import make_iterator, prepare, shards
from sdm_jax.training import loop
from sdm_jax.training.metrics import MetricsLog

VOCAB = 512


@pytest.fixture(scope="module")
def stdlib_corpus(tmp_path_factory):
  directory = tmp_path_factory.mktemp("stdlib_corpus")
  inputs = [f"{sysconfig.get_paths()['stdlib']}/json/*.py", "pydoc"]
  prepare.prepare(inputs, f"train:{VOCAB}", directory, validation_fraction=0.1, log=lambda _: None)
  return directory


def tiny_config(directory, steps):
  config = get_config(f"gdn2,{directory}")
  assert config.data.vocab_size == config.model.vocab_size == VOCAB  # read from the manifest
  config.data.seq_len, config.data.batch_size, config.data.packing = 64, 4, "first_fit"
  config.model.pattern, config.model.num_layers, config.model.width, config.model.num_heads = "A", 1, 32, 2
  config.model.head_dim = config.model.value_dim = 16
  config.train.steps, config.train.warmup_steps = steps, 1
  config.train.log_every, config.train.eval_every, config.train.checkpoint_every = 1, steps, 2
  config.train.eval_batches = 2
  return config


def saved_data_states(workdir):
  """{step: the data iterator's state in that checkpoint}."""
  manager = ocp.CheckpointManager(pathlib.Path(workdir).resolve() / "checkpoints")
  states = {step: manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
            for step in manager.all_steps()}
  manager.close()
  return states


def test_trains_resumes_and_evaluates_on_packed_stdlib_text(stdlib_corpus, tmp_path):
  config = tiny_config(stdlib_corpus, steps=4)
  loop.train(config, tmp_path, stop_after=2, log=lambda _: None)
  loop.train(config, tmp_path, log=lambda _: None)
  # The resumed run restored the iterator from the step-2 checkpoint and went on: after 4 steps it stands where
  # an iterator that yielded 4 batches stands (a restart from the first batch would stand at 2).
  iterator = make_iterator(config, "train")
  expected = {}
  for step in range(1, 5):
    next(iterator)
    expected[step] = json.loads(json.dumps(iterator.get_state()))
  assert saved_data_states(tmp_path) == {2: expected[2], 4: expected[4]} and expected[2] != expected[4]
  records = MetricsLog(tmp_path).read()
  losses = [r["loss"] for r in records if r["split"] == "train"]
  assert len(losses) == 4 and np.all(np.isfinite(losses))
  assert abs(losses[0] - math.log(VOCAB)) < 1.0  # an untrained model is near uniform
  evaluation = [r for r in records if r["split"] == "eval"][-1]
  totals = shards.load_manifest(stdlib_corpus)["splits"]["validation"]
  targets_per_byte = (totals["tokens"] - totals["documents"]) / totals["bytes"]
  assert np.isfinite(evaluation["loss"]) and 0 < evaluation["loss"] < 2 * math.log(VOCAB)
  assert evaluation["perplexity"] == pytest.approx(math.exp(evaluation["loss"]), rel=1e-6)
  assert evaluation["bits_per_byte"] == pytest.approx(evaluation["loss"] / math.log(2) * targets_per_byte)
