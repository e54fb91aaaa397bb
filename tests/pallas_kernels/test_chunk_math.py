"""chunk_math outside a kernel.

The triangular inverse: the near-fp32 Newton step must undo the error of the one-pass level merges.
On the GPU those merges run in TF32 (~1e-4 relative error, measured); the CPU has no TF32, so the
test makes them coarser still, with bf16 operands (~4e-3), and checks that the result is back at
fp32 accuracy. The decayed Gram matrices: elementwise sub-blocks plus the tree's levels, and the one or two dots of
a bounded decay, forward and backward, against a float64 brute force."""

import re

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


def _brute_gram(x, y, G):
  """M[r, c] = sum_k x[r,k] y[c,k] exp(G_r - G_c) for c < r, in float64."""
  C = G.shape[0]
  expo = G[:, None, :] - G[None, :, :]
  lower = np.tril(np.ones((C, C), bool), -1)[:, :, None]
  return np.sum(np.where(lower, x[:, None, :] * y[None, :, :] * np.exp(np.where(lower, expo, 0.0)), 0.0), axis=-1)


@pytest.mark.parametrize("C,sub", [(16, 16), (64, 16), (64, 8), (32, 32)])
@pytest.mark.parametrize("decay", [0.05, 30.0])  # per-step log decay scale: mild, and DESIGN.md section 6's strongest
def test_decayed_grams_elementwise_blocks_and_tree_match_brute_force(C, sub, decay):
  """Pairs inside sub-row blocks (elementwise) and across them (the tree's dots) together give every
  pair c < r once, forward and backward, also with g down to -30 per step (no inf, no NaN)."""
  r = np.random.default_rng(C + sub)
  _check_grams(r, C, sub, np.cumsum(-decay * r.uniform(size=(C, 16)), axis=0))


@pytest.mark.parametrize("C", [16, 32, 64])
@pytest.mark.parametrize("bound", ["lowest", "one level"])
@pytest.mark.parametrize("decay", ["at bound", "mixed"])
def test_bounded_grams_match_brute_force(C, bound, decay):
  """With g >= a lower bound the pairs inside blocks of b rows take one dot through each block's middle row: at the
  lowest bound the chunk takes, b = C / 2 with the tree's top level across the halves (factors at e^+-40); at half
  of it, b = C. Forward and backward, g at the bound everywhere or mixed between it and 0 (exactly 0 on some
  steps), and with cotangents of 1e-6: what the factors lose to flushed subnormals must not depend on their scale."""
  r = np.random.default_rng(C + len(bound) + len(decay))
  lower_bound = cm.lowest_bound(C) * (1.0 if bound == "lowest" else 0.5)
  block = cm.check_lower_bound(lower_bound, C)
  assert block == (C // 2 if bound == "lowest" else C) and abs(lower_bound) * block / 2 == cm.BOUNDED_EXPONENT
  shape = (C, 16)
  g = np.full(shape, lower_bound) if decay == "at bound" else (
      lower_bound * r.uniform(size=shape) * (r.uniform(size=shape) < 0.8))
  _check_grams(r, C, 4, np.cumsum(g, axis=0), bounded_block=block, cotangent_scale=1e-6)


@pytest.mark.parametrize("C, lower_bound, dots", [(32, -2.5, 1), (32, -5.0, 2), (16, -5.0, 1)])
def test_bounded_grams_take_one_or_two_dots(C, lower_bound, dots):
  """The bounded grams take no elementwise sub-blocks (no loop): per x one dot where |lower_bound| C / 2 <= 40, else
  two (the tree's top level, then the halves); the backward two per dot."""
  K = 16
  x, y, G = (jnp.zeros((C, K), jnp.float32) for _ in range(3))
  dm = jnp.zeros((C, C), jnp.float32)
  rows = (lambda at: y[at], lambda at: G[at])
  block = cm.check_lower_bound(lower_bound, C)
  forward = jax.make_jaxpr(lambda x: cm.decayed_grams([x, x], y, G, jax.lax.Precision.HIGHEST, rows, 4, block))(x)
  backward = jax.make_jaxpr(lambda x: cm.decayed_grams_bwd([(x, dm), (x, dm)], y, G, jax.lax.Precision.HIGHEST,
                                                           rows, 4, block))(x)
  for jaxpr, want in ((forward, 2 * dots), (backward, 4 * dots)):
    names = [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns]
    assert names.count("dot_general") == want and "while" not in names and "scan" not in names, names


@pytest.mark.parametrize("C", [16, 32, 64])
def test_lower_bound_is_checked_against_the_chunk_size(C):
  lowest = cm.lowest_bound(C)
  assert lowest == {16: -10.0, 32: -5.0, 64: -2.5}[C]
  assert cm.check_lower_bound(None, C) is None
  assert [cm.check_lower_bound(bound, C) for bound in (lowest, lowest / 2, -1e-3)] == [C // 2, C, C]
  for bad in (0.0, 0.5, lowest * 1.01, -float("inf"), float("nan"), True, "-5"):
    with pytest.raises(ValueError, match=rf"^lower_bound: expected None or a number in \[{lowest:g}, 0\) at chunk "
                                         rf"size {C} .* got {re.escape(repr(bad))}$"):
      cm.check_lower_bound(bad, C)
  with pytest.raises(ValueError, match=r"^lower_bound: expected None with one decay per head"):
    cm.check_lower_bound(-1.0, C, scalar_decay=True)


def _check_grams(r, C, sub, G, bounded_block=None, cotangent_scale=1.0):
  """decayed_grams and decayed_grams_bwd at the cumsum G [C, K] against a float64 brute force, the cotangents dM
  drawn N(0, cotangent_scale^2) (the backward's tolerance scaled with them)."""
  K = G.shape[1]
  x1, x2, y = (r.normal(size=(C, K)) for _ in range(3))
  dm1, dm2 = (cotangent_scale * np.tril(r.normal(size=(C, C)), -1) for _ in range(2))
  # The reference starts from the same fp32 values (G rounded to fp32 moves exponents near -1000 by 3e-5).
  x1, x2, y, G, dm1, dm2 = (np.float64(np.float32(a)) for a in (x1, x2, y, G, dm1, dm2))
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  rows = lambda c, d: (lambda at: c[at], lambda at: d[at])  # gathered rows (loads inside a kernel)
  grams = lambda a, b, c, d: cm.decayed_grams([a, b], c, d, jax.lax.Precision.HIGHEST, rows(c, d), sub=sub,
                                             bounded_block=bounded_block)
  M1, M2 = jax.jit(grams)(f32(x1), f32(x2), f32(y), f32(G))
  for M, x in ((M1, x1), (M2, x2)):
    np.testing.assert_allclose(np.asarray(M), _brute_gram(x, y, G), rtol=1e-5, atol=1e-5)

  bwd = jax.jit(lambda a, b, c, d, e, f: cm.decayed_grams_bwd([(a, e), (b, f)], c, d, jax.lax.Precision.HIGHEST,
                                                              rows(c, d), sub=sub, bounded_block=bounded_block))
  (dx1, dx2), dy, dG = bwd(f32(x1), f32(x2), f32(y), f32(G), f32(dm1), f32(dm2))
  # The brute-force cotangents, by hand in float64: dM[r,c] times each factor of the pair's term.
  expo = G[:, None, :] - G[None, :, :]
  lower = np.tril(np.ones((C, C), bool), -1)[:, :, None]
  E = np.where(lower, np.exp(np.where(lower, expo, 0.0)), 0.0)
  want_dx1 = np.einsum("rc,ck,rck->rk", dm1, y, E)
  want_dx2 = np.einsum("rc,ck,rck->rk", dm2, y, E)
  terms = dm1[:, :, None] * x1[:, None, :] * y[None] * E + dm2[:, :, None] * x2[:, None, :] * y[None] * E
  want_dy = np.einsum("rc,rk,rck->ck", dm1, x1, E) + np.einsum("rc,rk,rck->ck", dm2, x2, E)
  want_dG = terms.sum(axis=1) - terms.sum(axis=0)
  for got, want in ((dx1, want_dx1), (dx2, want_dx2), (dy, want_dy), (dG, want_dG)):
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * cotangent_scale)
