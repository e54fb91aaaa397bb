"""The layer-kind registry: every registered kind builds in a model, has costs and a legend label, and a kind
registered by a test (README "Contributing: adding a layer kind") is everywhere at once."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from sdm_jax.layers import RMSNorm
from sdm_jax.models import LanguageModel, costs
from sdm_jax.models.config import default_config
from sdm_jax.models.layer_kinds import LAYERS, LayerKind, register
from sdm_jax.training.sweep_summary import mixer_label


def small(pattern):
  c = default_config()
  c.pattern, c.num_layers, c.vocab_size, c.width, c.window = pattern, len(pattern), 64, 32, 8
  c.num_heads, c.head_dim, c.value_dim, c.sdm.num_heads, c.sdm.num_slots, c.sdm.value_dim, c.sdm.key_dim = (
      2, 16, 16, 2, 64, 16, 8)
  c.mla.kv_lora_rank, c.mla.qk_nope_head_dim, c.mla.qk_rope_head_dim, c.mla.v_head_dim = 32, 16, 8, 16
  c.impl = c.sdm.impl = "chunk"
  return c


@pytest.mark.parametrize("letter", list(LAYERS))
def test_every_kind_builds_decodes_and_has_costs(letter):
  config = small(letter)
  model = LanguageModel(config, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, 64)
  logits = model(tokens)
  assert logits.shape == (2, 12, 64) and bool(jnp.all(jnp.isfinite(logits)))
  prefill, _ = model.prefill(tokens, max_len=16)
  assert float(jnp.abs(prefill - logits).max()) <= 1e-4 * float(jnp.abs(logits).max())
  assert costs.mixer_flops_per_token(config, 12) > 0
  assert mixer_label(config.to_dict()) == (LAYERS[letter].label or config.mixer)


class Mean(nnx.Module):
  """A throwaway token mixer: the running mean of the inputs, then a norm (no cache to speak of)."""

  def __init__(self, width):
    self.norm = RMSNorm(width)

  def __call__(self, x, segment_ids=None, positions=None):
    return self.norm(jnp.cumsum(x, axis=1) / jnp.arange(1, x.shape[1] + 1)[:, None])


def test_a_registered_kind_is_in_the_model_costs_and_labels():
  kind = register(LayerKind("Z", "mean", lambda c, dtype, rngs: Mean(c.width), lambda c, seq_len: 2.0 * c.width,
                            "running mean (test)"))
  try:
    config = small("DZ")
    model = LanguageModel(config, rngs=nnx.Rngs(0))
    assert isinstance(model.blocks[1].mixer, Mean)
    assert model(jnp.zeros((1, 5), jnp.int32)).shape == (1, 5, 64)
    assert costs.mixer_flops_per_token(config, 8) == costs.mixer_flops_per_token(small("D"), 8) + 3 * 2.0 * 32
    assert mixer_label(config.to_dict()) == f"{config.mixer}+mean"
  finally:
    del LAYERS[kind.letter]
  with pytest.raises(ValueError, match="pattern: expected a non-empty string of"):
    LanguageModel(small("DZ"), rngs=nnx.Rngs(0))


def test_register_refuses_a_taken_or_bad_letter():
  with pytest.raises(ValueError, match="already registered"):
    register(dataclasses.replace(LAYERS["D"]))
  with pytest.raises(ValueError, match="one capital letter"):
    register(dataclasses.replace(LAYERS["D"], letter="dd"))
