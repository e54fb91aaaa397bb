"""The product-key addressing kernel: interpret-mode results against impl="xla", the custom VJP's gradients
against autodiff of impl="xla", and a 'cuda' lowering check for an abstract NVIDIA H200 (catches primitives
that interpret mode accepts but Triton does not).

Named apart from tests/ops/test_product_key.py: the test directories are not packages, so pytest
cannot collect two modules with one basename.
"""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.product_key import product_key_address as address_kernel
from sdm_jax.ops.product_key import _subkey_scores, product_key_address, product_key_topk, rank_pairs

from sdm_jax.testing.lowering import TRITON_CALL, lower_for_h200


def _inputs(B, T, H, n, D, values, seed):
  """values: "normal" (continuous), "quarters" (normal rounded to 1/4: every dot exact in any order, some
  ties) or "integers" (0, 1, 2: many tied sub-scores and pair sums)."""
  rng = np.random.default_rng(seed)
  draw = {
      "normal": lambda shape: rng.standard_normal(shape) / D**0.25,
      "quarters": lambda shape: np.round(rng.standard_normal(shape) * 4) / 4,
      "integers": lambda shape: rng.integers(0, 3, shape),
  }[values]
  return tuple(jnp.asarray(draw(shape), jnp.float32) for shape in ((B, T, H, D),) * 2 + ((H, n, D),) * 2)


# (B, T, H, n, k, D, values): k > n with B * T = 20 rows (not a multiple of the 16-row block); k < n with
# ties; n, k, D not powers of two; k = n * n with n padded from 8 to 16 sub-keys.
CONFIGS = [
    (1, 20, 2, 32, 128, 16, "quarters"),
    (2, 8, 1, 64, 16, 64, "integers"),
    (1, 5, 2, 24, 10, 24, "normal"),
    (1, 3, 2, 8, 64, 16, "integers"),
]


@pytest.mark.parametrize("B, T, H, n, k, D, values", CONFIGS)
def test_kernel_matches_xla(B, T, H, n, k, D, values):
  x1, x2, c1, c2 = _inputs(B, T, H, n, D, values, zlib.crc32(repr((B, T, H, n, k, D, values)).encode()))
  flat = lambda x: x.reshape(B * T, H, D)
  idx, weights, scores = address_kernel(flat(x1), flat(x2), c1, c2, k, rank_pairs(k, n), interpret=True)
  ref_scores, ref_idx = jax.jit(lambda *a: product_key_topk(_subkey_scores(*a[:2]), _subkey_scores(*a[2:]), k))(
      x1, c1, x2, c2)
  ref_weights = jax.nn.softmax(ref_scores, axis=-1)
  unflat = lambda x: np.asarray(x).reshape(B, T, H, k)
  assert idx.dtype == jnp.int32 and weights.dtype == scores.dtype == jnp.float32
  np.testing.assert_array_equal(unflat(idx), ref_idx)
  np.testing.assert_allclose(unflat(weights), ref_weights, rtol=0, atol=1e-6)
  # Exact when every dot is exact; otherwise only the summation order differs.
  np.testing.assert_allclose(unflat(scores), ref_scores, rtol=0, atol=0 if values != "normal" else 1e-5)
  if values == "integers":  # the tie order was exercised
    assert (np.diff(np.asarray(scores), axis=-1) == 0).any()


def test_gradients_match_xla():
  B, T, H, n, k, D = 1, 6, 2, 16, 8, 16
  args = _inputs(B, T, H, n, D, "normal", 7)
  r = jnp.asarray(np.random.default_rng(8).standard_normal((B, T, H, k)), jnp.float32)

  def loss(impl):
    return lambda *a: jnp.sum(product_key_address(*a, k, impl=impl)[1] * r)

  grads = jax.jit(jax.grad(loss("pallas"), argnums=(0, 1, 2, 3)))(*args)
  ref_grads = jax.jit(jax.grad(loss("xla"), argnums=(0, 1, 2, 3)))(*args)
  for g, ref in zip(grads, ref_grads):
    assert np.all(np.isfinite(g)) and np.linalg.norm(ref) > 0
    np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad, name", [
    ({"x2": jnp.zeros((1, 4, 2, 8))}, "x2"),
    ({"c1": jnp.zeros((2, 8, 8))}, "c1"),
    ({"c2": jnp.zeros((2, 8, 16), jnp.bfloat16)}, "c2"),
    ({"x1": jnp.zeros((1, 4, 2, 16), jnp.int32)}, "x1"),
    ({"k": 65}, "k"),
    ({"impl": "triton"}, "impl"),
])
def test_bad_input_raises(bad, name):
  args = {"x1": jnp.zeros((1, 4, 2, 16)), "x2": jnp.zeros((1, 4, 2, 16)), "c1": jnp.zeros((2, 8, 16)),
          "c2": jnp.zeros((2, 8, 16)), "k": 4, "impl": "pallas"} | bad
  with pytest.raises(ValueError, match=rf"\b{name}\b"):
    product_key_address(**args)


@pytest.mark.parametrize("n, k, D, dtype", [
    (1024, 128, 128, jnp.float32), (1024, 128, 128, jnp.bfloat16), (64, 16, 64, jnp.bfloat16),
    (32, 128, 64, jnp.float32),
])
def test_lowers_for_cuda(n, k, D, dtype):
  M, H = 40, 2
  spec = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
  text = lower_for_h200(lambda *a: address_kernel(*a, k, rank_pairs(k, n)), spec(M, H, D), spec(M, H, D),
                        spec(H, n, D), spec(H, n, D))
  assert text.count(TRITON_CALL) == 1
