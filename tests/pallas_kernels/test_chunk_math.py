"""chunk_math's triangular inverse outside a kernel: the near-fp32 Newton step must undo the error of
the one-pass level merges. On the GPU those merges run in TF32 (~1e-4 relative error, measured); the
CPU has no TF32, so the test makes them coarser still, with bf16 operands (~4e-3), and checks that
the result is back at fp32 accuracy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import chunk_math as cm


def _delta_rule_T(C, K, seed):
  """T = strictly lower diag(beta) K K^T with unit keys and beta in (0, 1): the Gram of a chunk."""
  r = np.random.default_rng(seed)
  k = r.normal(size=(C, K))
  k /= np.linalg.norm(k, axis=1, keepdims=True)
  beta = r.uniform(size=(C, 1))
  return np.tril(beta * (k @ k.T), -1)


def _inverse_error(T, dots):
  A = np.asarray(jax.jit(lambda t: cm.unit_lower_inverse(t, dots))(jnp.asarray(T, jnp.float32)), np.float64)
  exact = np.linalg.inv(np.eye(T.shape[0]) + T)
  return np.linalg.norm(A - exact) / np.linalg.norm(exact)


@pytest.mark.parametrize("C", [16, 64])
@pytest.mark.parametrize("seed", [0, 1])
def test_newton_step_restores_fp32_accuracy_after_coarse_level_merges(C, seed):
  T = _delta_rule_T(C, 16, seed)
  highest = jax.lax.Precision.HIGHEST
  coarse_levels = cm.Dots(near=highest, io=highest, tf32=cm.BF16_OPERANDS)
  all_coarse = cm.Dots(near=cm.BF16_OPERANDS, io=highest, tf32=cm.BF16_OPERANDS)
  assert _inverse_error(T, all_coarse) > 1e-4  # the coarse merges alone are far from fp32
  assert _inverse_error(T, coarse_levels) < 1e-5
