"""product_key_topk held to brute force: all n * n sums materialised, then lax.top_k."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdm_jax.ops import product_key_topk
from sdm_jax.ops.product_key import candidate_rank_pairs
from sdm_jax.testing.inputs import seed_of

# (n, k): k = 1, k < n, k = n, k > n, k = n * n, and the k << n * n regime of the paper's addressing.
SIZES = [(8, 1), (8, 5), (8, 8), (8, 20), (4, 16), (32, 128), (64, 32)]
BATCH = (2, 3)


def _brute_force(s1, s2, k):
  n = s1.shape[-1]
  sums = (s1[..., :, None] + s2[..., None, :]).reshape(s1.shape[:-1] + (n * n,))
  return jax.lax.top_k(sums, k)


# Jitted once per shape: eager dispatch compiles every primitive separately and dominates the runtime.
_product_key_topk = jax.jit(product_key_topk, static_argnums=2)
_brute_force_topk = jax.jit(_brute_force, static_argnums=2)


def _normal(n, seed):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal(BATCH + (n,)), jnp.float32),
          jnp.asarray(rng.standard_normal(BATCH + (n,)), jnp.float32))


def _integers(n, seed):
  """Few distinct values, so many sub-scores and many pair sums tie."""
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.integers(0, 4, BATCH + (n,)), jnp.float32),
          jnp.asarray(rng.integers(0, 4, BATCH + (n,)), jnp.float32))


def _rank_order_reference(s1, s2, k):
  """The documented tie policy, by brute force: sum descending, then rank of a in s1, then rank of b in s2.

  A rank orders one half by value descending, the lower index first among equal values.
  """
  s1, s2 = np.asarray(s1), np.asarray(s2)
  n = s1.shape[-1]
  idx = np.empty(s1.shape[:-1] + (k,), np.int64)
  for row in np.ndindex(s1.shape[:-1]):
    rank1 = np.argsort(np.argsort(-s1[row], kind="stable"), kind="stable")
    rank2 = np.argsort(np.argsort(-s2[row], kind="stable"), kind="stable")
    a, b = np.divmod(np.arange(n * n), n)
    sums = s1[row][a] + s2[row][b]
    idx[row] = np.lexsort((rank2[b], rank1[a], -sums))[:k]
  return idx


@pytest.mark.parametrize("n, k", SIZES)
def test_matches_brute_force(n, k):
  s1, s2 = _normal(n, seed_of("brute", n, k))
  scores, idx = _product_key_topk(s1, s2, k)
  ref_scores, ref_idx = _brute_force_topk(s1, s2, k)
  assert scores.shape == idx.shape == BATCH + (k,)
  assert scores.dtype == jnp.float32 and idx.dtype == jnp.int32
  np.testing.assert_array_equal(scores, ref_scores)
  np.testing.assert_array_equal(idx, ref_idx)


@pytest.mark.parametrize("n, k", SIZES)
def test_ties_give_exact_scores_and_the_documented_slots(n, k):
  s1, s2 = _integers(n, seed_of("ties", n, k))
  scores, idx = _product_key_topk(s1, s2, k)
  ref_scores, _ = _brute_force_topk(s1, s2, k)
  np.testing.assert_array_equal(scores, ref_scores)
  idx = np.asarray(idx)
  assert ((0 <= idx) & (idx < n * n)).all()
  assert all(len(set(row)) == k for row in idx.reshape(-1, k))
  a, b = np.divmod(idx, n)
  slot_sums = np.take_along_axis(np.asarray(s1), a, -1) + np.take_along_axis(np.asarray(s2), b, -1)
  np.testing.assert_array_equal(slot_sums, scores)
  np.testing.assert_array_equal(idx, _rank_order_reference(s1, s2, k))


@pytest.mark.parametrize("n, k", [(32, 128), (64, 32)])
def test_bf16_scores_are_the_rounded_float32_top_k(n, k):
  """Under jit XLA:CPU once returned truncated, not rounded, bf16 sums; the reference is numpy's."""
  s1, s2 = (x.astype(jnp.bfloat16) for x in _normal(n, seed_of("bf16", n, k)))
  scores, idx = _product_key_topk(s1, s2, k)
  wide1, wide2 = np.asarray(s1, np.float32), np.asarray(s2, np.float32)
  sums = (wide1[..., :, None] + wide2[..., None, :]).reshape(BATCH + (n * n,))
  ref_scores = -np.sort(-sums, axis=-1)[..., :k]
  assert scores.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(scores, np.float32), ref_scores.astype(jnp.bfloat16).astype(np.float32))
  np.testing.assert_array_equal(idx, _rank_order_reference(wide1, wide2, k))


@pytest.mark.parametrize("n, k", [(8, 5), (8, 20), (32, 128)])
def test_gradients_match_brute_force(n, k):
  s1, s2 = _normal(n, seed_of("grad", n, k))
  r = jnp.asarray(np.random.default_rng(seed_of("grad weights", n, k)).standard_normal(BATCH + (k,)), jnp.float32)

  def loss(topk):
    return lambda s1, s2: jnp.sum(topk(s1, s2, k)[0] * r)

  grads = jax.jit(jax.grad(loss(product_key_topk), argnums=(0, 1)))(s1, s2)
  ref_grads = jax.jit(jax.grad(loss(_brute_force), argnums=(0, 1)))(s1, s2)
  for g, ref in zip(grads, ref_grads):
    np.testing.assert_allclose(g, ref, rtol=1e-6, atol=1e-6)


def test_jit_and_vmap_match_eager():
  n, k = 16, 24
  s1, s2 = _normal(n, seed_of("transforms"))
  scores, idx = product_key_topk(s1, s2, k)
  jit_scores, jit_idx = jax.jit(product_key_topk, static_argnums=2)(s1, s2, k)
  vmap_scores, vmap_idx = jax.jit(jax.vmap(lambda x, y: product_key_topk(x, y, k)))(s1, s2)
  for got_scores, got_idx in ((jit_scores, jit_idx), (vmap_scores, vmap_idx)):
    np.testing.assert_array_equal(got_scores, scores)
    np.testing.assert_array_equal(got_idx, idx)


def test_candidates_are_far_fewer_than_all_pairs():
  rank1, rank2 = candidate_rank_pairs(128, 128)  # n = 256, k = 128: m = min(k, n) = 128
  assert len(rank1) == len(rank2) < 256 * 256
  assert len(rank1) == sum(128 // (i + 1) for i in range(128))
  assert ((rank1 + 1) * (rank2 + 1) <= 128).all()
  assert len(set(zip(rank1.tolist(), rank2.tolist()))) == len(rank1)


def test_mismatched_s2_raises():
  s1 = jnp.zeros((2, 8))
  with pytest.raises(ValueError, match=r"\bs2\b"):
    product_key_topk(s1, jnp.zeros((2, 9)), 4)
  with pytest.raises(ValueError, match=r"\bs2\b"):
    product_key_topk(s1, jnp.zeros((8,)), 4)
  with pytest.raises(ValueError, match=r"\bs2\b"):
    product_key_topk(s1, jnp.zeros((2, 8), jnp.bfloat16), 4)


def test_integer_s1_raises():
  with pytest.raises(ValueError, match=r"\bs1\b"):
    product_key_topk(jnp.zeros((2, 8), jnp.int32), jnp.zeros((2, 8)), 4)


@pytest.mark.parametrize("k", [0, -1, 65, 4.0, True])
def test_bad_k_raises(k):
  with pytest.raises(ValueError, match=r"\bk\b"):
    product_key_topk(jnp.zeros((2, 8)), jnp.zeros((2, 8)), k)
