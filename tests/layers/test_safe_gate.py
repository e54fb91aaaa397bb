"""fla's safe gate in the dense layers (`DeltaLayerConfig.lower_bound`, DESIGN.md section 4): the bounded decay is
fla's formula and stays in [lower_bound, 0), the layer hands the bound to the op so that impl="pallas" (interpret mode
here) runs bounded and equals impl="chunk", forward and gradients, the default leaves the layer as it is, and every
bound the op would refuse is a ValueError when the layer is built."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdm_jax.layers import DeltaMixer, LogDecay, layer_config
from sdm_jax.models.config import default_config, delta_layer
from sdm_jax.models.lm import LanguageModel
from sdm_jax.ops import MIXERS
from sdm_jax.testing.errors import FP32_TOL, relative_error
from sdm_jax.testing.inputs import seed_of
from sdm_jax.testing.lowering import equations

B, T, WIDTH, H, K = 2, 40, 32, 2, 16  # T = 40 with chunk_size 16: two full chunks and one padded


def _numpy_decay(decay, x, lower_bound):
  """The decay of `decay` (a LogDecay with low_rank) at x, in float64 numpy from its parameters: fla's gate
  (`fla/ops/kda/gate.py`), softplus or bounded."""
  w1, w2 = (np.asarray(layer.kernel[...], np.float64) for layer in decay.f_proj.layers)
  f = np.asarray(x, np.float64) @ w1 @ w2 + np.asarray(decay.dt_bias[...], np.float64)
  f = f.reshape(*x.shape[:2], decay.num_heads, decay.channels)
  a = np.exp(np.asarray(decay.A_log[...], np.float64))[:, None]
  if lower_bound is None:
    return -a * np.logaddexp(0.0, f)
  return lower_bound / (1.0 + np.exp(-a * f))


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_the_decay_is_fla_s_gate(lower_bound):
  """With A_log and dt_bias drawn away from their init, so that a misplaced exp(A_log) or bias shows."""
  seed = seed_of("safe gate formula", lower_bound)
  decay = LogDecay(WIDTH, H, K, low_rank=8, lower_bound=lower_bound, rngs=nnx.Rngs(seed))
  keys = jax.random.split(jax.random.key(seed), 3)
  decay.A_log[...] = jnp.log(jax.random.uniform(keys[0], (H,), minval=1.0, maxval=16.0))
  decay.dt_bias[...] = jax.random.normal(keys[1], (H * K,))
  x = jax.random.normal(keys[2], (B, T, WIDTH))
  g = decay(x)
  assert g.dtype == jnp.float32 and g.shape == (B, T, H, K)
  assert relative_error(g, _numpy_decay(decay, x, lower_bound)) <= 1e-6
  if lower_bound is not None:
    assert float(g.min()) >= lower_bound and float(g.max()) < 0
    # Saturated: sigmoid rounds to 1 and to 0 in fp32, and g reaches the bound and 0 but never passes them.
    g = np.asarray(decay(1e4 * x))
    assert g.min() == lower_bound and g.max() == 0.0


def test_the_bounded_decay_starts_as_fla_s_safe_gate_layer():
  """A_log at 0 (exp(A_log) = 1, fla's `KimiDeltaAttention(safe_gate=True)` and its model's `_init_weights`), dt_bias
  the same draw as without the bound; so g starts at lower_bound * sigmoid(dt_bias) when f(x) = 0."""
  plain, bounded = (LogDecay(WIDTH, H, K, low_rank=8, lower_bound=bound, rngs=nnx.Rngs(0)) for bound in (None, -5.0))
  np.testing.assert_array_equal(bounded.A_log[...], np.zeros(H, np.float32))
  assert float(jnp.min(jnp.abs(plain.A_log[...]))) > 0
  np.testing.assert_array_equal(bounded.dt_bias[...], plain.dt_bias[...])
  g = bounded(jnp.zeros((1, 1, WIDTH)))
  np.testing.assert_allclose(g.reshape(-1), -5.0 * jax.nn.sigmoid(bounded.dt_bias[...]), rtol=1e-6)


def _layer(mixer, impl, lower_bound, chunk_size=16, seed=0):
  return DeltaMixer(WIDTH, mixer=mixer, num_heads=H, head_dim=K, value_dim=MIXERS[mixer].value_dim(K, 8),
                    layer=layer_config(mixer, lower_bound=lower_bound), impl=impl, chunk_size=chunk_size,
                    rngs=nnx.Rngs(seed))


@pytest.mark.parametrize("mixer", ["kda", "gdn", "gdn2"])
def test_the_default_changes_nothing_but_the_option(mixer):
  """The model config leaves lower_bound None, which is the preset as it is; a bound changes A_log's start alone."""
  c = default_config()
  c.mixer = mixer
  assert c.delta.lower_bound is None and delta_layer(c) == layer_config(mixer)
  assert layer_config(mixer).lower_bound is None
  if mixer == "gdn":
    return  # one decay per head: refused, below
  plain = nnx.to_flat_state(nnx.state(_layer(mixer, "chunk", None), nnx.Param))
  bounded = nnx.to_flat_state(nnx.state(_layer(mixer, "chunk", -10.0), nnx.Param))
  assert [path for path, _ in plain] == [path for path, _ in bounded]
  for (path, a), (_, b) in zip(plain, bounded):
    if path != ("decay", "A_log"):
      np.testing.assert_array_equal(a[...], b[...], err_msg=str(path))


def _with_spread_decay(layer, seed):
  """The layer with A_log ~ log U(1, 16) and dt_bias ~ N(0, 3): g spread over [lower_bound, 0), much of it near the
  bound (at C = 16 and lower_bound -10 the kernels' factors reach e^80), rather than the init's g near 0."""
  keys = jax.random.split(jax.random.key(seed))
  decay = layer.decay
  decay.A_log[...] = jnp.log(jax.random.uniform(keys[0], decay.A_log.shape, minval=1.0, maxval=16.0))
  decay.dt_bias[...] = 3 * jax.random.normal(keys[1], decay.dt_bias.shape)
  return layer


@pytest.mark.parametrize("mixer", ["kda", "gdn2"])
def test_bounded_pallas_matches_chunk(mixer):
  """Outputs and the gradients of x and of every parameter, at impl="pallas"'s fp32 tolerances (DESIGN.md 6)."""
  seed = seed_of("safe gate layer", mixer)
  keys = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(keys[0], (B, T, WIDTH))
  r = jax.random.normal(keys[1], (B, T, WIDTH))
  results = {}
  for impl in ("pallas", "chunk"):
    graphdef, params = nnx.split(_with_spread_decay(_layer(mixer, impl, -10.0), seed))
    objective = lambda params, x, graphdef=graphdef: jnp.sum(nnx.merge(graphdef, params)(x) * r)
    y = jax.jit(lambda params, x, graphdef=graphdef: nnx.merge(graphdef, params)(x))(params, x)
    results[impl] = y, jax.jit(jax.grad(objective, argnums=(0, 1)))(params, x)
  g = _with_spread_decay(_layer(mixer, "chunk", -10.0), seed).decay(x)
  assert float(jnp.mean(g < -5.0)) > 0.2  # the bound's half of the range is well used
  (y, (d_params, d_x)), (y_ref, (d_params_ref, d_x_ref)) = results["pallas"], results["chunk"]
  out_tol, grad_tol = FP32_TOL["pallas"]
  assert relative_error(y, y_ref) <= out_tol
  assert relative_error(d_x, d_x_ref) <= grad_tol
  for (path, a), (_, b) in zip(nnx.to_flat_state(d_params), nnx.to_flat_state(d_params_ref)):
    assert relative_error(a[...], b[...]) <= grad_tol, path


def _gram_solve_loops(layer, x):
  """The loops (scan or while) in the body of the forward's gram_solve launch."""
  graphdef, state = nnx.split(layer)
  jaxpr = jax.make_jaxpr(lambda state, x: nnx.merge(graphdef, state)(x))(state, x)
  launch = next(eqn for eqn in equations(jaxpr)
                if eqn.primitive.name == "pallas_call" and eqn.params["name"] == "delta_rule_gram_solve")
  return sum(eqn.primitive.name in ("scan", "while") for eqn in equations(launch.params["jaxpr"]))


def test_the_layer_hands_its_bound_to_the_op():
  """Bounded, gram_solve forms its grams with one dot each and drops the loop over the sub-blocks' pairs."""
  x = jnp.zeros((1, 32, WIDTH))
  plain, bounded = (_gram_solve_loops(_layer("kda", "pallas", bound), x) for bound in (None, -10.0))
  assert bounded < plain


def test_bounds_the_op_would_refuse_are_named_when_the_layer_is_built():
  with pytest.raises(ValueError, match=r"^gdn layer's lower_bound: expected None with one decay per head"):
    _layer("gdn", "chunk", -1.0)
  with pytest.raises(ValueError, match=r"^kda layer's lower_bound: expected None or a number in \[-5, 0\) at chunk "
                                       r"size 32"):
    _layer("kda", "chunk", -8.0, chunk_size=None)  # impl="pallas"'s rule, 32, whatever impl the layer runs
  with pytest.raises(ValueError, match=r"^gdn2 layer's lower_bound: expected None or a number in \[-10, 0\)"):
    _layer("gdn2", "scan", 0.5)
  _layer("gdn2", "chunk", -8.0)  # chunk 16 takes it
  c = default_config()
  c.mixer, c.delta.lower_bound = "kda", -8.0
  with pytest.raises(ValueError, match=r"^kda layer's lower_bound: expected None or a number in \[-5, 0\)"):
    LanguageModel(c, rngs=nnx.Rngs(0))
  c.delta.lower_bound = -5.0
  y = LanguageModel(c, rngs=nnx.Rngs(0))(jnp.zeros((1, 8), jnp.int32))
  assert bool(jnp.all(jnp.isfinite(y)))
