"""Product-key addressing (SPEC.md section 3): the exact top-k of all pairwise sums of two sub-key score halves."""

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.ops.validation import check_float


@functools.lru_cache(maxsize=None)
def candidate_rank_pairs(k, m):
  """The static rank pairs (i, j), i, j < m, with (i + 1) * (j + 1) <= k, in lexicographic order.

  The (i + 1) * (j + 1) pairs ranked at or above (i, j) in both halves all have a sum at least as
  large and come no later in the tie order, so (i, j) reaches the top k only if they number <= k.
  Lexicographic order is the tie-break: lax.top_k keeps the earlier candidate among equal sums.
  About k * ln(k) pairs instead of m * m.
  Returns (rank1, rank2), read-only int32 numpy arrays of equal length.
  """
  rank1 = np.concatenate([np.full(min(k // (i + 1), m), i, np.int32) for i in range(min(k, m))])
  rank2 = np.concatenate([np.arange(min(k // (i + 1), m), dtype=np.int32) for i in range(min(k, m))])
  rank1.flags.writeable = rank2.flags.writeable = False
  return rank1, rank2


def _check(s1, s2, k):
  check_float("s1", s1)
  check_float("s2", s2)
  if s1.ndim < 1:
    raise ValueError(f"s1: expected shape [..., n] (rank >= 1), got shape {tuple(s1.shape)}")
  if s2.shape != s1.shape or s2.dtype != s1.dtype:
    raise ValueError(f"s2: expected the shape and dtype of s1, {tuple(s1.shape)} {s1.dtype}, "
                     f"got {tuple(s2.shape)} {s2.dtype}")
  if isinstance(k, bool):
    raise ValueError(f"k: expected a positive Python int, got {k!r}")
  try:
    k = operator.index(k)
  except TypeError:
    raise ValueError(f"k: expected a positive Python int (static under jit), got {k!r}") from None
  n = s1.shape[-1]
  if not 1 <= k <= n * n:
    raise ValueError(f"k: expected 1 <= k <= n * n = {n * n} (n = {n} sub-keys per half), got {k}")
  return k


def product_key_topk(s1, s2, k):
  """The exact top-k of s1[..., a] + s2[..., b] over all n * n pairs, without forming them.

  s1, s2: [..., n] sub-key scores of the two halves (same shape and float dtype; leading dims are
  batch dims). k: a Python int in [1, n * n], static under jit.
  Returns (scores [..., k] in s1.dtype, sorted descending; idx [..., k] int32, idx = a * n + b).

  The scores are exactly the k largest pairwise sums s1[a] + s2[b] (bf16/fp16 halves are added in
  float32 and rounded back once, which is what the input dtype's own add returns).
  Ties: lax.top_k ranks each half by value, the lower index first among equal values. Pairs are
  ordered by their sum (float32 for 16-bit inputs, so equal rounded scores can still be ordered
  by the finer sum), then by the rank of a in s1, then by the rank of b in s2. For finite inputs
  the result is deterministic and, when no two sums are equal, idx is the brute-force top-k's.
  With tied sums the chosen slots may differ from a brute-force lax.top_k over the flat n * n
  sums (which prefers the smaller flat index a * n + b); the scores never do.
  Differentiable in s1 and s2 through the selected scores; idx carries no gradient.
  """
  k = _check(s1, s2, k)
  n = s1.shape[-1]
  # A rank >= k in either half is beaten by k pairs (itself with each better rank), so m bounds both.
  m = min(k, n)
  top1, arg1 = jax.lax.top_k(s1, m, is_stable=True)
  top2, arg2 = jax.lax.top_k(s2, m, is_stable=True)
  rank1, rank2 = candidate_rank_pairs(k, m)
  # Sums of 16-bit halves are ranked in float32: XLA may keep a fused bf16 add in float32 ("excess
  # precision") and XLA:CPU's packed-key top_k then truncates it instead of rounding. Rounding is
  # monotone, so the rounded top k of the float32 sums are exactly the k largest 16-bit sums.
  compute = jnp.promote_types(s1.dtype, jnp.float32)
  candidates = top1.astype(compute)[..., rank1] + top2.astype(compute)[..., rank2]
  scores, chosen = jax.lax.top_k(candidates, k, is_stable=True)
  a = jnp.take_along_axis(arg1, jnp.asarray(rank1)[chosen], axis=-1)
  b = jnp.take_along_axis(arg2, jnp.asarray(rank2)[chosen], axis=-1)
  return scores.astype(s1.dtype), a * n + b
