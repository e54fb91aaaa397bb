"""The dense delta-rule layer for every variant: scan and chunk agree, parameters ignore the impl,
outputs are causal, the decay starts in the papers' ranges and the gates have the papers' shapes."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdm_jax.layers import DeltaMixer
from sdm_jax.layers.decay import A_RANGE, DT_RANGE
from sdm_jax.ops import MIXERS
from sdm_jax.testing.errors import relative_error

B, T, WIDTH, H, K = 2, 24, 32, 2, 16  # T = 24 with chunk_size 16: one full chunk and one padded


def value_dim(mixer):
  return MIXERS[mixer].value_dim(K, 8)  # K != V wherever the mixer allows it


def make_layer(mixer, impl, seed=0, num_heads=H):
  return DeltaMixer(WIDTH, mixer=mixer, num_heads=num_heads, head_dim=K, value_dim=value_dim(mixer), impl=impl,
                    chunk_size=16, rngs=nnx.Rngs(seed))


@functools.lru_cache(maxsize=None)
def forward(mixer, impl):
  """The jitted forward of a seed-0 layer, compiled once per (mixer, impl)."""
  graphdef, state = nnx.split(make_layer(mixer, impl))
  run = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
  return lambda x: run(state, x)


def inputs(seed):
  return jax.random.normal(jax.random.key(seed), (B, T, WIDTH), jnp.float32)


@pytest.mark.parametrize("mixer", MIXERS)
def test_parameters_do_not_depend_on_impl(mixer):
  states = [nnx.state(make_layer(mixer, impl), nnx.Param) for impl in ("scan", "chunk", "pallas")]
  for other in states[1:]:
    assert jax.tree.structure(other) == jax.tree.structure(states[0])
    for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(other)):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mixer", MIXERS)
def test_chunk_matches_scan(mixer):
  x = inputs(1)
  ref = forward(mixer, "scan")(x)
  out = forward(mixer, "chunk")(x)
  assert out.shape == (B, T, WIDTH) and bool(jnp.all(jnp.isfinite(out)))
  assert relative_error(out, ref) <= 1e-5


@pytest.mark.parametrize("mixer", MIXERS)
def test_causal(mixer):
  t = 13
  x = inputs(2)
  x_changed = x.at[:, t].add(jax.random.normal(jax.random.key(3), (B, WIDTH)))
  run = forward(mixer, "chunk")
  out, out_changed = run(x), run(x_changed)
  np.testing.assert_allclose(out_changed[:, :t], out[:, :t], rtol=0, atol=1e-6)
  assert float(jnp.min(jnp.abs(out_changed[:, t:] - out[:, t:]).max(-1))) > 1e-4  # every later token sees it


@pytest.mark.parametrize("mixer", ("gdn", "kda"))
def test_decay_init_ranges(mixer):
  heads = 64
  layer = make_layer(mixer, "chunk", seed=4, num_heads=heads)
  decay, (a_low, a_high) = layer.decay, layer.layer.a_log_range
  a = np.exp(np.asarray(decay.A_log[...]))
  dt = np.asarray(jax.nn.softplus(decay.dt_bias[...]))
  assert a.shape == (heads,)
  assert dt.shape == ((heads,) if mixer == "gdn" else (heads * K,))
  assert (a_low, a_high) == ((0.0, 16.0) if mixer == "gdn" else A_RANGE)  # GDN's code draws from U(0, 16)
  assert a_low <= a.min() and a.max() <= a_high
  assert DT_RANGE[0] * (1 - 1e-5) <= dt.min() and dt.max() <= DT_RANGE[1] * (1 + 1e-5)
  # Spread over the whole range (uniform in a, log-uniform in dt), not a constant.
  assert a.min() < 3 and a.max() > 14
  assert dt.min() < 2e-3 and dt.max() > 5e-2


# Output width of each gate projection for H heads, K = 16, V = 8 (16 for FG2-GDN), from DESIGN.md section 4.
GATE_WIDTHS = {
    "gdn": {"beta_proj": H},
    "kda": {"beta_proj": H},
    "fg2_gdn": {"beta_proj": H * K},
    "fg2_gdn_plus": {"beta_k_proj": H * K, "beta_v_proj": H * 8},
    "gdn2": {"b_proj": H * K, "w_proj": H * 8},
}


def test_every_registered_mixer_has_its_gate_widths():
  """README "Contributing: adding a mixer": a new mixer needs its gate widths written here."""
  assert set(MIXERS) <= set(GATE_WIDTHS), sorted(set(MIXERS) - set(GATE_WIDTHS))


@pytest.mark.parametrize("mixer", MIXERS)
def test_gate_and_decay_shapes(mixer):
  layer = make_layer(mixer, "chunk")
  gates = {name: getattr(layer, name).out_features for name in vars(layer) if name.endswith("_proj")
           and name not in ("q_proj", "k_proj", "v_proj", "o_proj", "out_gate_proj")}
  assert gates == GATE_WIDTHS[mixer]
  f_out = jax.eval_shape(layer.decay, inputs(0))
  assert f_out.shape == ((B, T, H) if mixer == "gdn" else (B, T, H, K))


def test_fg2_gdn_needs_equal_key_and_value_dims():
  with pytest.raises(ValueError, match="value_dim"):
    DeltaMixer(WIDTH, mixer="fg2_gdn", num_heads=H, head_dim=K, value_dim=8, rngs=nnx.Rngs(0))
