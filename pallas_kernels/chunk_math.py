"""In-kernel math shared by the forward and backward chunk kernels (SPEC.md section 2).

Every tile is a whole chunk of C rows, so the work is a few large dots instead of many 16x16 ones.

Decayed pair products. The intra-chunk Gram matrices need exp(G_r - G_c) for every pair c < r
of one chunk (G: the chunk's fp32 cumsum of g, per key channel). The pairs are split by a binary
tree over the chunk: at level b (block sizes C, C/2, ..., 2) a pair belongs to the level where r
sits in the second half of a b-block and c in its first half. The decay then factors through the
block's midpoint m (the last row of its first half) as

    exp(G_r - G_m) * exp(G_m - G_c),       both exponents <= 0,

so each level is one masked dot and no exponent is ever positive (strong decay stays finite; the
masks are applied before exp). The diagonal pair c = r has decay 1.

The tree stops at blocks of SUB_BLOCK rows: a level of block b fills only b / (4 C) of the [C, C]
matrix, so the small levels would be full dots for a few entries. Pairs inside one SUB_BLOCK-row
block are formed elementwise instead, one row offset d at a time: row r meets row r - d, loaded
shifted from the kernel's refs, with the decay of the exact span sum g_{r-d+1} + ... + g_r (<= 0),
and the products are summed over the key channels.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

# Near-fp32 tensor-core products (three TF32 passes); plain TF32 gave ~6e-4 relative error in the inverse.
F32_DOT = jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3
# io products of bf16 inputs: operands rounded to bf16, fp32 accumulation (the bf16 error budget is 1e-2).
BF16_OPERANDS = "bf16 operands"
SUB_BLOCK = 8  # rows of the blocks whose pairs are formed elementwise (the tree's dots cover larger blocks)


class Dots(NamedTuple):
  """Dot settings of a kernel: near (fp32-exact work: inverse corrections, cumsums), io (products of
  io-rounded data) and tf32 (one-pass products that a near-fp32 step corrects afterwards)."""
  near: object
  io: object
  tf32: object


def precisions(io_dtype, interpret):
  """The kernel's `Dots`. bf16 inputs round their io operands to bf16 (in the CPU interpreter too);
  other inputs keep near-fp32 for the io products. The interpreter only knows HIGHEST."""
  near = jax.lax.Precision.HIGHEST if interpret else F32_DOT
  io = BF16_OPERANDS if jnp.dtype(io_dtype) == jnp.bfloat16 else near
  return Dots(near, io, jax.lax.Precision.HIGHEST if interpret else jax.lax.Precision.DEFAULT)


def dot(a, b, precision):
  if isinstance(precision, str) and precision == BF16_OPERANDS:
    a, b, precision = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), None
  return jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)


def iota(shape, axis):
  return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def block_sizes(C, sub=1):
  """The tree's block sizes C, C/2, ..., down to 2 * sub (sub = 1: every level)."""
  return [b for b in (C >> i for i in range(C.bit_length() - 1)) if b > sub]


def pair_mask(C, b):
  """[C, C] the pairs (r, c) of level b: one b-block, r in its second half, c in its first."""
  r, c = iota((C, C), 0), iota((C, C), 1)
  half = b // 2
  return ((r // b) == (c // b)) & ((r % b) >= half) & ((c % b) < half)


def level_factors(G, b):
  """(row factor, column factor) [C, K] of level b, G [C, K] the chunk's fp32 cumsum.

  row factor = exp(G_r - G_m) on rows in the second half of their b-block (else 0); column factor =
  exp(G_m - G_c) on rows in the first half (else 0); m the last row of the first half.
  """
  C, K = G.shape
  half = b // 2
  blocks = G.reshape(C // b, b, K)
  mid = jnp.sum(jnp.where(iota(blocks.shape, 1) == half - 1, blocks, 0.0), axis=1, keepdims=True)
  G_mid = jnp.broadcast_to(mid, blocks.shape).reshape(C, K)
  late = (iota((C, K), 0) % b) >= half
  row_factor = jnp.where(late, jnp.exp(jnp.where(late, G - G_mid, 0.0)), 0.0)
  col_factor = jnp.where(late, 0.0, jnp.exp(jnp.where(late, 0.0, G_mid - G)))
  return row_factor, col_factor


def offset_column(D, d):
  """Column d of D [C, sub] as [C, 1]."""
  return jnp.sum(jnp.where(iota(D.shape, 1) == d, D, 0.0), axis=1, keepdims=True)


def place_offsets(D):
  """D [C, sub] -> M [C, C]: M[r, r - d] = D[r, d] for 0 < d < sub (D is zero where r - d leaves r's block)."""
  C, sub = D.shape
  diff = iota((C, C), 0) - iota((C, C), 1)
  M = jnp.zeros((C, C), jnp.float32)
  for d in range(1, sub):
    M = jnp.where(diff == d, offset_column(D, d), M)
  return M


def take_offsets(M, sub, lower):
  """[C, C] -> D [C, sub]: D[r, d] = M[r, r - d] (lower) or M[r + d, r] (not lower), for 0 < d < sub."""
  C = M.shape[0]
  M, diff = (M, iota((C, C), 0) - iota((C, C), 1)) if lower else (M.T, iota((C, C), 1) - iota((C, C), 0))
  D = jnp.zeros((C, sub), jnp.float32)
  for d in range(1, sub):
    D = jnp.where(iota((C, sub), 1) == d, jnp.sum(jnp.where(diff == d, M, 0.0), axis=1, keepdims=True), D)
  return D


def masked_exp(x, mask):
  return jnp.where(mask, jnp.exp(jnp.where(mask, x, 0.0)), 0.0)


def block_offsets(xs, y_at, g_at, sub):
  """The pairs (r, r - d), 0 < d < sub, inside one sub-row block: D [C, sub] per x [C, K] with
  D[r, d] = sum_k x[r,k] y[r-d,k] exp(g_{r-d+1} + ... + g_r) (`place_offsets` puts them in [C, C]).

  y_at(s), g_at(s): [C, K] y and the per-step log decay g at rows r + s (clamped into the chunk). The
  exponent is the exact sum over the pair's span, accumulated one offset at a time.
  """
  C, K = xs[0].shape
  rows = iota((C, K), 0) % sub

  def offset(d, carry):
    span, Ds = carry
    span = span + g_at(1 - d)
    y_decayed = y_at(-d) * masked_exp(span, rows >= d)
    pick = iota((C, sub), 1) == d
    return span, tuple(D + jnp.where(pick, jnp.sum(x * y_decayed, axis=1, keepdims=True), 0.0) for D, x in zip(Ds, xs))

  zeros = tuple(jnp.zeros((C, sub), jnp.float32) for _ in xs)
  return list(jax.lax.fori_loop(1, sub, offset, (jnp.zeros((C, K), jnp.float32), zeros))[1])


def block_offsets_bwd(x_ats, d_lower, d_upper, y_at, g_at, sub):
  """Backward of `block_offsets`: ([dx], dy) [C, K]. x_ats: each x at rows r + s; d_lower, d_upper: per
  x, `take_offsets` of its dM with lower=True (dM[r, r-d], for dx) and lower=False (dM[c+d, c], for dy)."""
  y = y_at(0)
  C, K = y.shape
  rows = iota((C, K), 0) % sub

  def offset(d, carry):
    back, ahead, dxs, dy = carry
    back, ahead = back + g_at(1 - d), ahead + g_at(d)  # the spans of pairs (r, r-d) and (r+d, r)
    y_decayed = y_at(-d) * masked_exp(back, rows >= d)
    dxs = tuple(dx + offset_column(dl, d) * y_decayed for dx, dl in zip(dxs, d_lower))
    later = sum(offset_column(du, d) * x_at(d) for du, x_at in zip(d_upper, x_ats))
    return back, ahead, dxs, dy + masked_exp(ahead, rows < sub - d) * later

  zeros = jnp.zeros((C, K), jnp.float32)
  _, _, dxs, dy = jax.lax.fori_loop(1, sub, offset, (zeros, zeros, tuple(zeros for _ in x_ats), zeros))
  return list(dxs), dy


def decayed_grams(xs, y, G, precision, sub=1):
  """For each x in xs [C, K]: M[r, c] = sum_k x[r,k] y[c,k] exp(G_r - G_c) over pairs c < r in different
  sub-row blocks (sub = 1: all pairs; the rest come from `block_offsets`)."""
  C = G.shape[0]
  grams = [jnp.zeros((C, C), jnp.float32) for _ in xs]
  for b in block_sizes(C, sub):
    row_factor, col_factor = level_factors(G, b)
    mask = pair_mask(C, b)
    y_col = (y * col_factor).T
    grams = [m + jnp.where(mask, dot(x * row_factor, y_col, precision), 0.0) for m, x in zip(grams, xs)]
  return grams


def decayed_grams_bwd(pairs, y, G, precision, loop_index, sub=1):
  """Backward of `decayed_grams`: ([dx], dy). pairs: [(x, dM)], dM [C, C] strictly lower.

  loop_index: the index of the enclosing loop over key blocks. The level masks depend on it so the
  compiler rebuilds each masked dM where it is used instead of hoisting all of them out of the loop
  (on the H200 the hoisted matrices overflowed shared memory).

  With the pair terms' dx and dy (tree and blocks), the gradient with respect to the cumsum G is
  sum x * dx - y * dy: each pair (r, c) adds its term to row r and subtracts it from row c, so the
  decay of a pair reaches exactly the g it spans once dG is reverse-cumsummed.
  """
  C = G.shape[0]
  dxs = [jnp.zeros_like(x) for x, _ in pairs]
  dy = jnp.zeros_like(y)
  for b in block_sizes(C, sub):
    row_factor, col_factor = level_factors(G, b)
    mask = pair_mask(C, b) & (loop_index >= 0)
    y_col = y * col_factor
    for i, (x, dm) in enumerate(pairs):
      dm = jnp.where(mask, dm, 0.0)
      dxs[i] += row_factor * dot(dm, y_col, precision)
      dy += col_factor * dot(dm.T, x * row_factor, precision)
  return dxs, dy


def unit_lower_inverse(T, dots):
  """(I + T)^-1 for a strictly lower T [C, C], exact to fp32.

  The diagonal blocks are merged level by level (2, 4, ..., C) in one-pass TF32: with A the inverse
  of the block diagonal of size b/2, the b-blocks are A - A (T on the level's pairs) A, the exact
  block inverse [[A11, 0], [-A22 T21 A11, A22]] (no powers of T, so no growth to cancel). One Newton
  step in near-fp32 then squares the relative error E = I - (I + T) A (TF32 leaves ~1e-4):
  A <- A + A E, so I - (I + T) A becomes E^2.
  """
  C = T.shape[0]
  eye = (iota((C, C), 0) == iota((C, C), 1)).astype(jnp.float32)
  A = eye
  for b in reversed(block_sizes(C)):
    A = A - dot(A, dot(jnp.where(pair_mask(C, b), T, 0.0), A, dots.tf32), dots.tf32)
  residual = eye - A - dot(T, A, dots.near)
  return A + dot(A, residual, dots.near)


def last_row(G):
  """G_C [K]: the last row of a chunk's cumsum G [C, K] (the same rounding as G, so G_C - G stays <= 0)."""
  return jnp.sum(jnp.where(iota(G.shape, 0) == G.shape[0] - 1, G, 0.0), axis=0)


def lower_ones(C, strict):
  """[C, C] 0/1: row t sums rows r < t (strict) or r <= t of what it multiplies."""
  r, c = iota((C, C), 0), iota((C, C), 1)
  return ((c < r) if strict else (c <= r)).astype(jnp.float32)
