"""The fused mixer-input kernel: interpret-mode outputs and gradients against the XLA reference for every mixer's
build, and a 'cuda' lowering check for an abstract NVIDIA H200."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.mixer_inputs import mixer_inputs, reference_inputs
from sdm_jax.ops import fg2_gdn, fg2_gdn_plus, gated_delta_rule, gdn2, kda

from lowering import TRITON_CALL, lower_for_h200

MIXERS = {"gdn": gated_delta_rule, "kda": kda, "fg2_gdn": fg2_gdn, "fg2_gdn_plus": fg2_gdn_plus, "gdn2": gdn2}
GATES = {  # dimensions of each gate after g: h head, k key, v value
    "gdn": "h", "kda": "h", "fg2_gdn": "k", "fg2_gdn_plus": "kv", "gdn2": "kv"}


def _build(mixer, B, T, H, K, V, dtype, seed=0):
  """(build, q, k, v, gates without g): the mixer's own build, from its undecorated body."""
  r = np.random.default_rng(seed)
  shape = {"h": (B, T, H), "k": (B, T, H, K), "v": (B, T, H, V)}
  x = lambda *s: jnp.asarray(r.normal(size=s), dtype)
  gates = [jnp.asarray(r.uniform(size=shape[d]), dtype) for d in GATES[mixer]]
  gates[0] = gates[0].at[..., :3].set(0.0)  # closed gates: sqrt's derivative is taken as 0 there
  g = jnp.zeros(shape["h" if mixer == "gdn" else "k"], jnp.float32)
  build, *_ = MIXERS[mixer].__wrapped__(x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), g, *gates)
  return build, x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), gates


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_matches_reference(mixer, dtype):
  B, T, H, K, V = 2, 40, 3, 32, 32  # T not a whole number of the kernel's row blocks
  build, q, k, v, gates = _build(mixer, B, T, H, K, V, dtype)
  for l2 in (True, False):
    ours = mixer_inputs(build, l2, dtype, q, k, v, *gates, interpret=True)
    ref = reference_inputs(build, l2, dtype, q, k, v, *gates)
    for a, b in zip(ours, ref):
      assert a.dtype == b.dtype == dtype and a.shape == b.shape
      a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
      if dtype == jnp.float32:
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
      else:  # the same fp32 values up to op order, rounded to bf16: at most one bf16 step apart, and rarely
        np.testing.assert_allclose(a, b, rtol=2.0**-7, atol=1e-6)
        assert np.mean(a != b) < 0.01

  def loss(fn, *args):
    return sum(jnp.sum(x.astype(jnp.float32) * w) for x, w in zip(fn(*args), (1.0, -2.0, 0.5, 3.0)))

  args = (q, k, v, *gates)
  argnums = tuple(range(len(args)))
  ours = jax.grad(lambda *a: loss(lambda *b: mixer_inputs(build, True, dtype, *b, interpret=True), *a),
                  argnums)(*args)
  ref = jax.grad(lambda *a: loss(lambda *b: reference_inputs(build, True, dtype, *b), *a), argnums)(*args)
  for a, b in zip(ours, ref):
    assert np.all(np.isfinite(np.asarray(a, np.float64)))
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-6, atol=1e-7)


def test_head_dims_it_does_not_take_go_to_the_reference():
  build, q, k, v, gates = _build("gdn2", 1, 8, 2, 24, 32, jnp.float32)  # K = 24: not a power of two
  ours = mixer_inputs(build, True, jnp.float32, q, k, v, *gates, interpret=True)
  for a, b in zip(ours, reference_inputs(build, True, jnp.float32, q, k, v, *gates)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_lowers_for_cuda(mixer):
  build, *_ = _build(mixer, 1, 64, 2, 128, 128, jnp.float32)
  shape = {"h": (1, 64, 2), "k": (1, 64, 2, 128), "v": (1, 64, 2, 128)}
  spec = lambda s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
  args = [spec(shape["k"])] * 2 + [spec(shape["v"])] + [spec(shape[d]) for d in GATES[mixer]]
  text = lower_for_h200(lambda *a: mixer_inputs(build, True, jnp.bfloat16, *a), *args)
  assert text.count(TRITON_CALL) == 1 and "mixer_inputs" in text
