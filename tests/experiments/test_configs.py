"""Every config variant builds, and its model runs one forward pass on a batch of its own data."""

import importlib

import jax
import pytest
from flax import nnx

from experiments.configs.common import VARIANTS
from sdm_jax.data import make_iterator
from sdm_jax.models import LanguageModel


@pytest.mark.parametrize("task", ["corpus", "mqar", "niah", "text"])
def test_every_variant_builds(task):
  module = importlib.import_module(f"experiments.configs.{task}")
  for variant in VARIANTS:
    config = module.get_config(variant)
    assert config.model.vocab_size == config.data.vocab_size
  with pytest.raises(ValueError, match="variant"):
    module.get_config("no_such_mixer")


@pytest.mark.parametrize("task,variant", [("mqar", "sdm"), ("niah", "gdn2_swa"), ("text", "fg2_attn")])
def test_model_runs_on_its_data(task, variant):
  config = importlib.import_module(f"experiments.configs.{task}").get_config(variant)
  config.data.batch_size, config.data.seq_len = 2, 64 if task != "niah" else 256
  config.model.width, config.model.num_heads, config.model.head_dim, config.model.value_dim = 32, 2, 16, 16
  if task == "niah":
    config.data.num_needles = config.data.num_queries = 1
  batch = next(make_iterator(config, "train"))
  # Under one jit: op by op, every op of the forward compiled alone, most of the test's time.
  forward = nnx.jit(lambda model, inputs: model(inputs))
  logits = forward(LanguageModel(config.model, rngs=nnx.Rngs(0)), batch["inputs"])
  assert logits.shape == (*batch["inputs"].shape, config.data.vocab_size)
  assert bool(jax.numpy.all(jax.numpy.isfinite(logits)))
