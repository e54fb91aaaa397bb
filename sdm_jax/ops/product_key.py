"""Product-key addressing (DESIGN.md section 3): the exact top-k of all pairwise sums of two sub-key score halves,
and the addressing built on it (queries and sub-key tables -> slots and softmax weights)."""

import dataclasses
import functools
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from pallas_kernels import product_key as product_key_kernel
from sdm_jax.ops.implementations import pick
from sdm_jax.ops.validation import check_float, check_shape, on_gpu


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


@functools.lru_cache(maxsize=None)
def rank_pairs(k, n):
  """candidate_rank_pairs(k, min(k, n)) as the Pallas kernel takes them: a static pair of tuples."""
  return tuple(tuple(int(i) for i in ranks) for ranks in candidate_rank_pairs(k, min(k, n)))


def _check(s1, s2, k):
  check_float("s1", s1)
  check_float("s2", s2)
  if s1.ndim < 1:
    raise ValueError(f"s1: expected shape [..., n] (rank >= 1), got shape {tuple(s1.shape)}")
  if s2.shape != s1.shape or s2.dtype != s1.dtype:
    raise ValueError(f"s2: expected the shape and dtype of s1, {tuple(s1.shape)} {s1.dtype}, "
                     f"got {tuple(s2.shape)} {s2.dtype}")
  return _check_k(k, s1.shape[-1])


def _check_k(k, n):
  if isinstance(k, bool):
    raise ValueError(f"k: expected a positive Python int, got {k!r}")
  try:
    k = operator.index(k)
  except TypeError:
    raise ValueError(f"k: expected a positive Python int (static under jit), got {k!r}") from None
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


@dataclasses.dataclass(frozen=True)
class XlaConfig:
  """impl="xla" has no options: einsum, then `product_key_topk`."""


@dataclasses.dataclass(frozen=True)
class PallasConfig:
  """What impl="pallas" runs with: the kernel's launch settings (`pallas_kernels.product_key.ProductKeySettings`),
  None for its rule for the shape (`ProductKeySettings.defaults`)."""
  settings: Any = None


# The implementations (`implementations.Implementation`). slots(x1, x2, c1, c2, k) gets the op's checked inputs and
# returns (idx [B, T, H, k] int32, best first, with no gradient; s1, s2 [B, T, H, n], the sub-key scores
# (`_subkey_scores`), which the weights are gathered from).


@dataclasses.dataclass(frozen=True)
class Xla:
  """impl="xla": the sub-key scores by einsum, the slots by `product_key_topk`."""
  name: str = "xla"
  config: XlaConfig = XlaConfig()

  def supported(self, backend):
    return True

  def slots(self, x1, x2, c1, c2, k):
    s1, s2 = _subkey_scores(x1, c1), _subkey_scores(x2, c2)
    return product_key_topk(jax.lax.stop_gradient(s1), jax.lax.stop_gradient(s2), k)[1], s1, s2


@dataclasses.dataclass(frozen=True)
class Pallas:
  """impl="pallas": the fused kernel finds the slots (`pallas_kernels.product_key`; interpret mode off a GPU), from
  inputs in their promoted dtype (float32, bfloat16 or float16; ValueError for float64)."""
  name: str = "pallas"
  config: PallasConfig = PallasConfig()

  def supported(self, backend):
    return backend == "gpu"

  def slots(self, x1, x2, c1, c2, k):
    dtype = jnp.promote_types(x1.dtype, c1.dtype)
    if dtype == jnp.float64:
      raise ValueError(f"x1: impl='pallas' supports float32, bfloat16 and float16 (with c1), got {x1.dtype} "
                       f"and {c1.dtype}")
    x1, x2, c1, c2 = (x.astype(dtype) for x in (x1, x2, c1, c2))
    B, T, H, D = x1.shape
    flat = lambda x: jax.lax.stop_gradient(x.reshape(B * T, H, D))
    idx = product_key_kernel.product_key_address(
        flat(x1), flat(x2), jax.lax.stop_gradient(c1), jax.lax.stop_gradient(c2), k, rank_pairs(k, c1.shape[1]),
        settings=self.config.settings, interpret=not on_gpu())[0].reshape(B, T, H, k)
    return idx, _subkey_scores(x1, c1), _subkey_scores(x2, c2)


# Product-key addressing's implementations in impl="auto"'s order: the kernel on a GPU, XLA elsewhere.
IMPLEMENTATIONS = {impl.name: impl for impl in (Pallas(), Xla())}
SLOTS_NAME = "product_key_slots"  # the checkpoint name of the slots product_key_address selects


def product_key_address(x1, x2, c1, c2, k, *, impl="auto"):
  """Product-key addressing: the k slots a * n + b with the largest scores x1 . c1[a] + x2 . c2[b].

  x1, x2: [B, T, H, D] query halves; c1, c2: [H, n, D] the head's sub-key tables (N = n * n slots).
  k: a Python int in [1, n * n], static under jit (W or R of DESIGN.md section 3).
  Returns (idx [B, T, H, k] int32, best first; weights [B, T, H, k] float32, the softmax of the
  selected scores). Sub-key scores are float32: products in the promoted dtype of x1 and c1,
  accumulated in float32. Ties follow product_key_topk.
  impl: a name in `IMPLEMENTATIONS`, "xla" (einsum + product_key_topk) or "pallas" (the fused kernel; interpret mode
  off the GPU), or "auto" (the default), the first supported on the backend ("pallas" on a GPU, else "xla"). Both
  give the same idx for the same scores and the same gradients: weights are differentiable in x1, x2, c1 and c2, idx
  carries none. idx is named SLOTS_NAME for remat policies (`jax.checkpoint_policies.save_only_these_names`).
  """
  dims = {}
  check_shape("x1", x1, ("B", "T", "H", "D"), dims)
  check_shape("x2", x2, ("B", "T", "H", "D"), dims)
  check_shape("c1", c1, ("H", "n", "D"), dims)
  check_shape("c2", c2, ("H", "n", "D"), dims)
  if x2.dtype != x1.dtype:
    raise ValueError(f"x2: expected the dtype of x1, {x1.dtype}, got {x2.dtype}")
  if c2.dtype != c1.dtype:
    raise ValueError(f"c2: expected the dtype of c1, {c1.dtype}, got {c2.dtype}")
  k = _check_k(k, dims["n"])
  implementation = pick(impl, IMPLEMENTATIONS)
  idx, s1, s2 = implementation.slots(x1, x2, c1, c2, k)
  # Named so that a remat policy can keep the slots (`models.lm`): the backward then needs no top-k (its sorts).
  idx = checkpoint_name(idx, SLOTS_NAME)
  # The weights from the selected scores, gathered again: their gradient is a scatter into the n sub-key scores
  # (memory [B, T, H, n]), with no top-k in the backward.
  a, b = jnp.divmod(idx, c1.shape[1])
  selected = jnp.take_along_axis(s1, a, axis=-1) + jnp.take_along_axis(s2, b, axis=-1)
  return idx, jax.nn.softmax(selected, axis=-1)


def _subkey_scores(x, c):
  """x [B, T, H, D], c [H, n, D] -> [B, T, H, n] in float32 (float64 for float64 inputs)."""
  dtype = jnp.promote_types(x.dtype, c.dtype)
  return jnp.einsum("bthd,hnd->bthn", x.astype(dtype), c.astype(dtype), precision=jax.lax.Precision.HIGHEST,
                    preferred_element_type=jnp.promote_types(dtype, jnp.float32))
