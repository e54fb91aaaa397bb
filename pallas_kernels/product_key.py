"""Pallas (Triton) kernel for product-key addressing (DESIGN.md section 3): scores, exact top-k, softmax.

One launch, grid (H, M / block_rows); each program takes block_rows query rows of one head:
  1. Per half, the sub-key scores s = x c^T [block_rows, n] as a list of [block_rows, block_cols]
     register tiles (one dot per column tile of the sub-key table), then m = min(k, n) selection
     rounds: row max, the lowest sub-key index reaching it (iota + min), that entry masked to -inf.
     Round r's value and index go straight into every candidate whose rank in this half is r, so
     the candidate sums top1[rank1] + top2[rank2] and slots a * n + b need no gather.
  2. k rounds over the candidate tile [block_rows, L] (L: the static rank-pair list, padded to a
     power of two): max, the earliest candidate reaching it, its slot, then masked to -inf.
  3. The softmax over the k recorded scores.
Triton has no sort, top_k or gather, and cannot slice a register tile, hence the rounds and masks.
Launch settings: `ProductKeySettings`.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.chunk_math import F32_DOT
from pallas_kernels.launch import Shape, one_at_a_time, require


def _pow2(n, floor=16):
  return max(floor, 1 << (n - 1).bit_length())


def _iota(shape, axis):
  return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def _address_kernel(x1_ref, x2_ref, c1_ref, c2_ref, rank1_ref, rank2_ref, idx_ref, weights_ref, scores_ref, *,
                    num_subkeys, k, block_cols, precision):
  f32 = jnp.float32
  rows = x1_ref.shape[0]
  num_tiles = c1_ref.shape[0] // block_cols
  num_candidates = rank1_ref.shape[0]
  k_pad = idx_ref.shape[-1]
  m = min(k, num_subkeys)
  col = _iota((rows, block_cols), 1)
  cols = [col + t * block_cols for t in range(num_tiles)]

  def scores(x_ref, c_ref):
    x = x_ref[...]
    tiles = []
    for t in range(num_tiles):
      c = c_ref[pl.ds(t * block_cols, block_cols), :]
      s = jnp.dot(x, c.T, precision=precision, preferred_element_type=f32)
      if (t + 1) * block_cols > num_subkeys:  # padded sub-keys never win a round
        s = jnp.where(cols[t] < num_subkeys, s, -jnp.inf)
      tiles.append(s)
    return tiles

  def select_half(x_ref, c_ref, rank, candidates, slots, first_half):
    """m rounds over one half's scores; round r writes into the candidates of rank r in this half."""
    def round_(r, carry):
      tiles, candidates, slots = carry
      best = functools.reduce(jnp.maximum, [jnp.max(s, axis=1, keepdims=True) for s in tiles])
      # Lowest index among equal values: lax.top_k's stable order.
      arg = functools.reduce(jnp.minimum, [
          jnp.min(jnp.where(s == best, c, num_tiles * block_cols), axis=1, keepdims=True)
          for s, c in zip(tiles, cols)])
      tiles = [jnp.where(c == arg, -jnp.inf, s) for s, c in zip(tiles, cols)]
      hit = rank == r
      if first_half:
        candidates = jnp.where(hit, best, candidates)
        slots = jnp.where(hit, arg * num_subkeys, slots)
      else:  # one float32 add per pair, as top1[rank1] + top2[rank2]
        candidates = jnp.where(hit, candidates + best, candidates)
        slots = jnp.where(hit, slots + arg, slots)
      return tiles, candidates, slots

    _, candidates, slots = jax.lax.fori_loop(0, m, round_, (scores(x_ref, c_ref), candidates, slots))
    return candidates, slots

  rank1 = rank1_ref[...][None, :]
  rank2 = rank2_ref[...][None, :]
  # Padding candidates (rank -1) stay at -inf.
  candidates = jnp.full((rows, num_candidates), -jnp.inf, f32)
  slots = jnp.zeros((rows, num_candidates), jnp.int32)
  candidates, slots = select_half(x1_ref, c1_ref, rank1, candidates, slots, True)
  candidates, slots = select_half(x2_ref, c2_ref, rank2, candidates, slots, False)

  position = _iota((rows, num_candidates), 1)
  out_col = _iota((rows, k_pad), 1)

  def pick(r, carry):
    candidates, top_scores, top_slots = carry
    best = jnp.max(candidates, axis=1, keepdims=True)
    # Earliest candidate among equal sums: the rank-pair list order, as lax.top_k over the candidates.
    first = jnp.min(jnp.where(candidates == best, position, num_candidates), axis=1, keepdims=True)
    chosen = position == first
    slot = jnp.sum(jnp.where(chosen, slots, 0), axis=1, keepdims=True)
    record = out_col == r
    return (jnp.where(chosen, -jnp.inf, candidates), jnp.where(record, best, top_scores),
            jnp.where(record, slot, top_slots))

  _, top_scores, top_slots = jax.lax.fori_loop(
      0, k, pick, (candidates, jnp.zeros((rows, k_pad), f32), jnp.zeros((rows, k_pad), jnp.int32)))

  valid = out_col < k
  top_max = jnp.max(jnp.where(valid, top_scores, -jnp.inf), axis=1, keepdims=True)
  unnormalised = jnp.where(valid, jnp.exp(top_scores - top_max), 0.0)
  idx_ref[...] = top_slots
  scores_ref[...] = top_scores
  weights_ref[...] = unnormalised / jnp.sum(unnormalised, axis=1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class ProductKeySettings:
  """Launch settings of `product_key_address`: block_rows query rows per program, sub-key score tiles of
  block_cols columns (both powers of two >= 16, block_cols at most the padded n) and the program's warps."""
  block_rows: int
  block_cols: int
  num_warps: int

  @classmethod
  def defaults(cls, shape):
    """The rule for n = sqrt(shape.N) sub-keys per half and the top k = shape.W, through the number of candidate
    rank pairs (`num_rank_pairs`)."""
    N, k = require(shape, cls.__name__, "N", "W")
    n = math.isqrt(N)
    num_pairs = num_rank_pairs(k, n)
    # Not swept: impl="xla" stays the default, the kernel being far slower than XLA's top-k path on the H200
    # (benchmarks/ops/README.md, launch settings). num_warps: the live register tiles (one half's scores plus the
    # candidate sums and slots) at <= ~64 words a thread each.
    block_rows, n_pad = 16, _pow2(n)
    elements = block_rows * (n_pad + 2 * _pow2(num_pairs))
    return cls(block_rows=block_rows, block_cols=min(128, n_pad),
               num_warps=min(16, max(4, _pow2(-(-elements // (32 * 64)), floor=1))))

  @classmethod
  def candidates(cls, shape):
    """32 query rows, narrower score tiles (at most the padded n) and 4 to 16 warps."""
    n_pad = _pow2(math.isqrt(require(shape, cls.__name__, "N")[0]))
    return one_at_a_time(cls, shape, block_rows=(32,), block_cols=tuple(c for c in (32, 64) if c <= n_pad),
                         num_warps=(4, 8, 16))


SETTINGS = (ProductKeySettings,)


def num_rank_pairs(k, n):
  """How many rank pairs can reach the top k of n x n sums: those (i, j), i, j < min(k, n), with
  (i + 1) (j + 1) <= k (the pairs `sdm_jax.ops.product_key.rank_pairs` lists for the kernel)."""
  return sum(min(k // (i + 1), n) for i in range(min(k, n)))


@functools.partial(jax.jit, static_argnames=("k", "rank_pairs", "settings", "interpret"))
def product_key_address(x1, x2, c1, c2, k, rank_pairs, *, settings=None, interpret=False):
  """Product-key addressing for every row and head: the k best slots, their softmax weights and scores.

  x1, x2: [M, H, D] query halves; c1, c2: [H, n, D] sub-key tables (one dtype for all four; float32
  products are near-fp32, 16-bit ones accumulate in float32). k: static int in [1, n * n].
  Returns idx [M, H, k] int32 (slot a * n + b, best first), weights [M, H, k] float32 (softmax of the
  selected scores) and scores [M, H, k] float32, with the tie order of product_key_topk.
  rank_pairs: static (rank1, rank2), tuples of equal length: the pairs of per-half ranks that can reach the top k
  (`sdm_jax.ops.product_key.candidate_rank_pairs`), the candidates' tie order. M, n and D need not be powers of
  two (padded here). settings: `ProductKeySettings` (None: its defaults for n * n slots and k).
  """
  M, H, D = x1.shape
  n = c1.shape[1]
  if not 1 <= k <= n * n:
    raise ValueError(f"k: expected 1 <= k <= n * n = {n * n}, got {k}")
  rank1, rank2 = (np.asarray(r, np.int32) for r in rank_pairs)
  if rank1.shape != rank2.shape or rank1.ndim != 1 or not len(rank1):
    raise ValueError(f"rank_pairs: expected two equal-length non-empty sequences, got lengths {len(rank_pairs[0])}"
                     f" and {len(rank_pairs[1])}")
  if settings is None:
    settings = ProductKeySettings.defaults(Shape(B=M, T=1, H=H, K=D, V=D, dtype=jnp.dtype(x1.dtype).name, N=n * n,
                                                 W=k))
  block_rows, block_cols = settings.block_rows, settings.block_cols
  num_candidates = _pow2(len(rank1))
  pad_ranks = lambda r: jnp.asarray(np.pad(r, (0, num_candidates - len(r)), constant_values=-1))
  m_pad, d_pad, n_pad, k_pad = -(-M // block_rows) * block_rows, _pow2(D), _pow2(n), _pow2(k)
  if n_pad % block_cols:
    raise ValueError(f"settings.block_cols: expected a power of two at most {n_pad} (n = {n} padded), "
                     f"got {block_cols}")
  # Zero rows and channels change no score; padded sub-keys are masked inside the kernel.
  x1, x2 = (jnp.pad(x, ((0, m_pad - M), (0, 0), (0, d_pad - D))) for x in (x1, x2))
  c1, c2 = (jnp.pad(c, ((0, 0), (0, n_pad - n), (0, d_pad - D))) for c in (c1, c2))
  if interpret:
    precision = jax.lax.Precision.HIGHEST  # the CPU interpreter only knows HIGHEST
  else:
    precision = F32_DOT if x1.dtype == jnp.float32 else None

  sq = pl.squeezed
  query_spec = pl.BlockSpec((block_rows, sq, d_pad), lambda h, i: (i, h, 0))
  table_spec = pl.BlockSpec((sq, n_pad, d_pad), lambda h, i: (h, 0, 0))
  rank_spec = pl.BlockSpec((num_candidates,), lambda h, i: (0,))
  out_spec = pl.BlockSpec((block_rows, sq, k_pad), lambda h, i: (i, h, 0))
  out_shape = lambda dtype: jax.ShapeDtypeStruct((m_pad, H, k_pad), dtype)
  idx, weights, scores = pl.pallas_call(
      functools.partial(_address_kernel, num_subkeys=n, k=k, block_cols=block_cols, precision=precision),
      out_shape=(out_shape(jnp.int32), out_shape(jnp.float32), out_shape(jnp.float32)),
      grid=(H, m_pad // block_rows),
      in_specs=[query_spec, query_spec, table_spec, table_spec, rank_spec, rank_spec],
      out_specs=(out_spec, out_spec, out_spec),
      compiler_params=pltriton.CompilerParams(num_warps=settings.num_warps, num_stages=1),
      interpret=interpret,
      name="product_key_address",
  )(x1, x2, c1, c2, pad_ranks(rank1), pad_ranks(rank2))
  return idx[:M, :, :k], weights[:M, :, :k], scores[:M, :, :k]
