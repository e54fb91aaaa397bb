"""Sparse Delta Memory's chunk-local slot ids against the brute-force [C, W, C, W] slot comparison
they replace: group ids, per-token weights and hits, multiplicities and gradients; and the within-token groups
of impl="pallas" (summed weights, first entries, the read weight at each write slot) against a brute-force
comparison."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdm_jax.ops.sparse_chunk import chunk_addressing, per_token, slot_groups
from sdm_jax.ops.sparse_pallas import _slot_groups, _summed_within_token, read_at_writes

C, W, R = 8, 3, 4


def _brute(k_idx, q_idx, k_w):
  """The former construction: same[t, w, s, x] = (k_idx[t, w] == k_idx[s, x]), likewise for reads."""
  same = k_idx[:, :, None, None] == k_idx[None, None, :, :]
  same_q = q_idx[:, :, None, None] == k_idx[None, None, :, :]
  return dict(hit=same.any(-1), hit_q=same_q.any(-1), weight=np.einsum("twsx,sx->tws", same, k_w),
              weight_q=np.einsum("trsx,sx->trs", same_q, k_w), multiplicity=same.sum((2, 3)))


@pytest.mark.parametrize("N,seed", [(1, 0), (5, 1), (12, 2), (1000, 3)])  # one slot, heavy, light, no collisions
def test_slot_groups_match_brute_force(N, seed):
  rng = np.random.default_rng(seed)
  k_idx = rng.integers(0, N, size=(C, W))
  k_idx[0, 1] = k_idx[0, 0]  # a slot listed twice in one token
  q_idx = rng.integers(0, N + 3, size=(C, R))  # some read slots no write has, some above every write slot
  k_w = rng.uniform(size=(C, W))
  u, u_q = map(np.asarray, slot_groups(jnp.asarray(k_idx), jnp.asarray(q_idx)))
  np.testing.assert_array_equal(u.reshape(-1)[:, None] == u.reshape(-1)[None, :],
                                k_idx.reshape(-1)[:, None] == k_idx.reshape(-1)[None, :])
  written = np.isin(q_idx, k_idx)
  assert np.all(u_q[~written] == C * W)
  np.testing.assert_array_equal(u_q[written], u.reshape(-1)[np.argmax(q_idx[written][:, None] == k_idx.reshape(-1), 1)])

  ref = _brute(k_idx, q_idx, k_w)
  counts = np.asarray(per_token(jnp.asarray(u), jnp.ones((C, W), jnp.int32)))
  weights = np.asarray(per_token(jnp.asarray(u), jnp.asarray(k_w, jnp.float32)))
  np.testing.assert_array_equal(counts[u] > 0, ref["hit"])
  np.testing.assert_array_equal(counts[u_q] > 0, ref["hit_q"])
  np.testing.assert_allclose(weights[u], ref["weight"], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(weights[u_q], ref["weight_q"], rtol=1e-6, atol=1e-7)
  a = chunk_addressing(jnp.asarray(k_idx), jnp.asarray(k_w, jnp.float32), -jnp.ones(C), jnp.full(C, 0.5),
                       jnp.asarray(q_idx), jnp.full((C, R), 0.25))
  np.testing.assert_array_equal(np.asarray(a["multiplicity"]), ref["multiplicity"])


def test_slot_tables_pass_gradients_to_the_weights():
  rng = np.random.default_rng(4)
  k_idx, q_idx = jnp.asarray(rng.integers(0, 6, size=(C, W))), jnp.asarray(rng.integers(0, 8, size=(C, R)))
  k_w = jnp.asarray(rng.uniform(size=(C, W)), jnp.float32)
  r, r_q = jnp.asarray(rng.normal(size=(C, W, C)), jnp.float32), jnp.asarray(rng.normal(size=(C, R, C)), jnp.float32)
  same = (k_idx[:, :, None, None] == k_idx[None, None, :, :]).astype(jnp.float32)
  same_q = (q_idx[:, :, None, None] == k_idx[None, None, :, :]).astype(jnp.float32)

  def grouped(k_w):
    u, u_q = slot_groups(k_idx, q_idx)
    weights = per_token(u, k_w)
    return jnp.sum(weights[u] * r) + jnp.sum(weights[u_q] * r_q)

  def brute(k_w):
    return jnp.sum(jnp.einsum("twsx,sx->tws", same, k_w) * r) + jnp.sum(jnp.einsum("trsx,sx->trs", same_q, k_w) * r_q)

  np.testing.assert_allclose(jax.grad(grouped)(k_w), jax.grad(brute)(k_w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("N", [1, 4, 1000])
def test_within_token_groups_match_brute_force(N):
  rng = np.random.default_rng(N)
  idx = rng.integers(0, N, size=(3, 5, 16))
  idx[0, 0, 3] = idx[0, 0, 0]  # a slot listed twice
  w = rng.uniform(size=idx.shape).astype(np.float32)
  same = idx[..., :, None] == idx[..., None, :]
  first = ~np.any(same & np.tril(np.ones((16, 16), bool), -1), axis=-1)
  group, got_first = _slot_groups(jnp.asarray(idx))
  np.testing.assert_array_equal(np.asarray(got_first), first)
  group = np.asarray(group)
  np.testing.assert_array_equal(group[..., :, None] == group[..., None, :], same)
  np.testing.assert_allclose(np.asarray(_summed_within_token(jnp.asarray(idx), jnp.asarray(w))),
                             np.einsum("...ij,...j->...i", same, w), rtol=1e-6)


@pytest.mark.parametrize("N,distinct", [(1, False), (6, False), (1000, False), (40, True)])
def test_read_at_writes_matches_brute_force(N, distinct):
  """The backward kernel's k_read: each write entry's slot's summed read weight at the same token, bit for bit, 0
  where the token does not read that slot (slots listed twice in reads and writes; with distinct slots, each entry
  its own weight)."""
  rng = np.random.default_rng(N)
  shape = (2, 7)
  if distinct:
    k_idx = np.stack([rng.permutation(N)[:16] for _ in range(14)]).reshape(*shape, 16)
    q_idx = np.stack([rng.permutation(N)[:8] for _ in range(14)]).reshape(*shape, 8)
  else:
    k_idx, q_idx = rng.integers(0, N, size=(*shape, 16)), rng.integers(0, N, size=(*shape, 8))
    q_idx[0, 0, 5] = q_idx[0, 0, 1]  # a read slot listed twice
  q_w = rng.normal(size=q_idx.shape).astype(np.float32)
  q_slot = np.asarray(_summed_within_token(jnp.asarray(q_idx), jnp.asarray(q_w), distinct))
  expected = np.zeros(k_idx.shape, np.float32)
  for i in np.ndindex(k_idx.shape):
    match = np.flatnonzero(q_idx[i[:-1]] == k_idx[i])
    expected[i] = q_slot[i[:-1]][match[0]] if match.size else 0.0
  got = np.asarray(read_at_writes(jnp.asarray(k_idx), jnp.asarray(q_idx), jnp.asarray(q_slot), distinct))
  np.testing.assert_array_equal(got, expected)
  assert np.count_nonzero(expected) > 0  # some write slots are read at their token
