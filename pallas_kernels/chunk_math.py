"""In-kernel math shared by the forward and backward chunk kernels (DESIGN.md section 2).

Every tile is a whole chunk of C rows, so the work is a few large dots instead of many 16x16 ones.

Decayed pair products. The intra-chunk Gram matrices need exp(G_r - G_c) for every pair c < r
of one chunk (G: the chunk's fp32 cumsum of g, per key channel). The pairs are split by a binary
tree over the chunk: at level b (block sizes C, C/2, ..., 2) a pair belongs to the level where r
sits in the second half of a b-block and c in its first half. The decay then factors through the
block's midpoint m (the last row of its first half) as

    exp(G_r - G_m) * exp(G_m - G_c),       both exponents <= 0,

so each level is one masked dot and no exponent is ever positive (strong decay stays finite; the
masks are applied before exp). The diagonal pair c = r has decay 1.

The tree stops at blocks of `sub` rows (the kernels' sub_block launch setting): a level of block b fills only
b / (4 C) of the [C, C] matrix, so the small levels would be full dots for a few entries. Pairs inside one
sub-row block are formed elementwise instead, one column offset j at a time: every row r is paired with
row j of its own block, exp(G_r - G_c) is taken directly (c < r, so the exponent is <= 0) and the
products are summed over the key channels.

Bounded decay. When the caller promises every per-step log decay g >= lower_bound (fla's safe gate),
G_r - G_c >= lower_bound (r - c), and one level covers every pair inside a block of b rows: all its rows
factor through the block's middle row m (the last of its first half) as exp(G_r - G_m) * exp(G_m - G_c).
The factors are then >= 1 on one side of m, but neither exponent exceeds |lower_bound| b / 2 in size, and
for c < r their product is exp(G_r - G_c) <= 1, the same decay the tree forms. b is the whole chunk where
|lower_bound| C / 2 <= BOUNDED_EXPONENT (one masked dot per Gram matrix), else its halves, with the tree's
top level across them (two dots); no elementwise sub-blocks either way (`check_lower_bound`).

The rows one pair needs (row j of a block, a level's midpoint) are gathered by index (`block_rows`)
from G and y as the kernels hold them in memory, rather than picked out of registers by a masked
sum over rows: G is the chunk cumsum the kernels read (`delta_rule_fwd.chunk_cumsum`).
"""

import numbers

from typing import NamedTuple

import jax
import jax.numpy as jnp

# Near-fp32 tensor-core products (three TF32 passes); plain TF32 gave ~6e-4 relative error in the inverse.
F32_DOT = jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3
# io products of bf16 inputs: operands rounded to bf16, fp32 accumulation (the bf16 error budget is 1e-2).
BF16_OPERANDS = "bf16 operands"
# The largest |exponent| of a bounded factor, |lower_bound| b / 2. fp32 and bf16 hold e^-87.3 to e^88.7 as normal
# numbers, and XLA's CPU runtime (a GPU's products may too) flushes what falls below to 0: a product in a dot of the
# smaller factor and two operands (x y forward; dT or dAqk times x backward, as small as the loss's scale makes them) is
# lost when below e^-87.3, and the larger factor, multiplying back, makes that an absolute error of up to
# e^(E - 87.3). At E = 80 (fla's bound -5 through the middle of a chunk of 32) that is 7e-4, the size of the
# gradient terms themselves once the loss is scaled by 1e-3 (tests/ops/test_lower_bound.py scales it by 1e-6); at
# 40 it is 3e-21, below fp32's resolution of any gradient above 1e-13, and the larger factor leaves e^48 to overflow.
BOUNDED_EXPONENT = 40.0


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


def lowest_bound(chunk_size):
  """The most negative lower_bound chunk_size rows take: |lower_bound| b / 2 = BOUNDED_EXPONENT with b = C / 2."""
  return -4 * BOUNDED_EXPONENT / chunk_size


def check_lower_bound(lower_bound, chunk_size, scalar_decay=False):
  """The block size b of the bounded level (`levels`) for chunk_size rows: chunk_size where |lower_bound| C / 2 <=
  BOUNDED_EXPONENT, else chunk_size / 2; None for lower_bound None. ValueError naming lower_bound unless it is None
  or a real number in [`lowest_bound(chunk_size)`, 0), and with scalar_decay (one decay per head, whose grams are
  plain dots times one decay matrix, with no factors to bound) unless it is None."""
  if lower_bound is None:
    return None
  if scalar_decay:
    raise ValueError(f"lower_bound: expected None with one decay per head (its grams are plain dots times one decay "
                     f"matrix already), got {lower_bound!r}")
  lowest = lowest_bound(chunk_size)
  if (isinstance(lower_bound, bool) or not isinstance(lower_bound, numbers.Real)
      or not lowest <= lower_bound < 0):
    raise ValueError(f"lower_bound: expected None or a number in [{lowest:g}, 0) at chunk size {chunk_size} "
                     f"(|lower_bound| * chunk_size / 4 <= {BOUNDED_EXPONENT:g} keeps every factor's exponent within "
                     f"fp32's), got {lower_bound!r}")
  return chunk_size if -lower_bound * chunk_size / 2 <= BOUNDED_EXPONENT else chunk_size // 2


def block_sizes(C, sub=1):
  """The tree's block sizes C, C/2, ..., down to 2 * sub (sub = 1: every level)."""
  return [b for b in (C >> i for i in range(C.bit_length() - 1)) if b > sub]


def pair_mask(C, b):
  """[C, C] the pairs (r, c) of level b: one b-block, r in its second half, c in its first."""
  r, c = iota((C, C), 0), iota((C, C), 1)
  half = b // 2
  return ((r // b) == (c // b)) & ((r % b) >= half) & ((c % b) < half)


def block_rows(C, b, j):
  """[C] int32: for every row, row j of its b-row block. Gathering x at it (x[block_rows(C, b, j)], a
  gathered load inside a kernel) repeats that row over the block, with no reduction across rows."""
  return (iota((C,), 0) // b) * b + j


def level_factors(G, b, G_mid):
  """(row factor, column factor) [C, K] of level b, G [C, K] the chunk's fp32 cumsum and G_mid [C, K] the last
  row of the first half of each row's b-block (G at `block_rows(C, b, b // 2 - 1)`).

  row factor = exp(G_r - G_m) on rows in the second half of their b-block (else 0); column factor =
  exp(G_m - G_c) on rows in the first half (else 0); m the last row of the first half.
  """
  C, K = G.shape
  late = (iota((C, K), 0) % b) >= b // 2
  # One exp serves both factors: G falls along the chunk, so both exponents are <= 0 on their rows.
  E = jnp.exp(jnp.where(late, G - G_mid, G_mid - G))
  return jnp.where(late, E, 0.0), jnp.where(late, 0.0, E)


def block_decay(G, G_j, j, sub):
  """[C, K] exp(G_r - G_c) with c row j of r's sub-row block (G_j: G there), on rows r after it (else 0)."""
  later = (iota(G.shape, 0) % sub) > j
  return jnp.where(later, jnp.exp(jnp.where(later, G - G_j, 0.0)), 0.0)


def offset_column(x, j):
  """Column j of x [C, sub] as [C, 1]."""
  return jnp.sum(jnp.where(iota(x.shape, 1) == j, x, 0.0), axis=1, keepdims=True)


def place_blocks(D):
  """D [C, sub] (D[r, j]: the pair of row r with row j of its block) -> [C, C] block diagonal."""
  C, sub = D.shape
  tiled = jnp.broadcast_to(D[:, None, :], (C, C // sub, sub)).reshape(C, C)
  return jnp.where(iota((C, C), 0) // sub == iota((C, C), 1) // sub, tiled, 0.0)


def take_blocks(M, sub):
  """[C, C] -> [C, sub]: the block-diagonal entries, D[r, j] = M[r, sub * (r // sub) + j]."""
  C = M.shape[0]
  blocks = M.reshape(C, C // sub, sub)
  return jnp.sum(jnp.where(iota(blocks.shape, 1) == iota(blocks.shape, 0) // sub, blocks, 0.0), axis=1)


def block_pairs(xs, G, sub, rows):
  """The pairs c < r inside one sub-row block, elementwise in fp32: per x, D [C, sub] with D[r, j] the pair of
  row r with row j of its block (`place_blocks` makes it the [C, C] block diagonal)."""
  C = G.shape[0]
  y_rows, G_rows = rows

  def offset(j, Ds):
    at = block_rows(C, sub, j)
    y_decayed = y_rows(at) * block_decay(G, G_rows(at), j, sub)
    pick = iota((C, sub), 1) == j
    return tuple(D + jnp.where(pick, jnp.sum(x * y_decayed, axis=1, keepdims=True), 0.0) for D, x in zip(Ds, xs))

  return list(jax.lax.fori_loop(0, sub - 1, offset, tuple(jnp.zeros((C, sub), jnp.float32) for _ in xs)))


def block_pairs_bwd(pairs, y, G, sub, rows):
  """Backward of `block_pairs`: ([dx], dy), pairs [(x, dM)] with dM [C, C] (only its blocks are read)."""
  C, K = G.shape
  y_rows, G_rows = rows
  dDs = [take_blocks(dm, sub) for _, dm in pairs]

  def offset(j, carry):
    dxs, dy = carry
    at = block_rows(C, sub, j)
    E = block_decay(G, G_rows(at), j, sub)
    y_decayed = y_rows(at) * E
    dms = [offset_column(dD, j) for dD in dDs]
    dxs = tuple(dx + dm * y_decayed for dx, dm in zip(dxs, dms))
    # Row j of each block gathers its pairs' terms summed over the block's later rows.
    to_j = sum(dm * x * E for dm, (x, _) in zip(dms, pairs)).reshape(C // sub, sub, K)
    summed = jnp.broadcast_to(jnp.sum(to_j, axis=1, keepdims=True), to_j.shape).reshape(C, K)
    return dxs, dy + jnp.where(iota((C, K), 0) % sub == j, summed, 0.0)

  zeros = jnp.zeros((C, K), jnp.float32)
  dxs, dy = jax.lax.fori_loop(0, sub - 1, offset, (tuple(zeros for _ in pairs), zeros))
  return list(dxs), dy


def levels(G, sub, G_rows, bounded_block=None):
  """The dots of the decayed grams, one per level, each (pairs [C, C] bool, row factor, column factor [C, K]): the
  level's pairs (r, c) take sum_k (x[r, k] row factor[r, k]) (y[c, k] column factor[c, k]). The tree's levels of
  blocks C down to 2 sub; with bounded_block b (g >= a lower bound, `check_lower_bound`) its levels down to 2 b, then
  one level of every pair c < r inside a b-row block through the block's middle row, both factors on every row.
  Those factors are finite, but the dot's entries above the diagonal (exp(G_r - G_c) >= 1) may overflow: the pair
  mask, a select, discards them. G_rows: G gathered at an index vector ([C] -> [C, K]). A generator, so each
  level's factors are formed where its dot uses them."""
  C = G.shape[0]
  for b in block_sizes(C, bounded_block or sub):
    row_factor, col_factor = level_factors(G, b, G_rows(block_rows(C, b, b // 2 - 1)))
    yield pair_mask(C, b), row_factor, col_factor
  if bounded_block:
    r, c = iota((C, C), 0), iota((C, C), 1)
    G_mid = G_rows(block_rows(C, bounded_block, bounded_block // 2 - 1))
    yield (r // bounded_block == c // bounded_block) & (c < r), jnp.exp(G - G_mid), jnp.exp(G_mid - G)


def level_pairs(xs, y, G, precision, sub, rows, bounded_block=None):
  """The pairs across sub-row blocks (with bounded_block, every pair), one masked dot per level (`levels`): per x,
  M [C, C]."""
  C = G.shape[0]
  Ms = [jnp.zeros((C, C), jnp.float32) for _ in xs]
  for mask, row_factor, col_factor in levels(G, sub, rows[1], bounded_block):
    y_col = (y * col_factor).T
    Ms = [m + jnp.where(mask, dot(x * row_factor, y_col, precision), 0.0) for m, x in zip(Ms, xs)]
  return Ms


def decayed_grams(xs, y, G, precision, rows, sub, bounded_block=None):
  """For each x in xs [C, K]: M[r, c] = sum_k x[r,k] y[c,k] exp(G_r - G_c) over pairs c < r (strictly lower).

  rows = (y_rows, G_rows): y and G gathered at an index vector ([C] -> [C, K]; in a kernel, loads from the
  refs, so no row is extracted by a reduction across rows). Inside a loop over key blocks, `block_pairs` and
  `level_pairs` can be summed separately and placed once at the end. bounded_block: None, or what
  `check_lower_bound` gives for a lower bound every per-step log decay keeps; then the levels form every pair
  (`levels`: one or two dots per x) and sub is not read.
  """
  sub = min(sub, G.shape[0])
  if bounded_block:
    return level_pairs(xs, y, G, precision, sub, rows, bounded_block)
  return [place_blocks(D) + M for D, M in zip(block_pairs(xs, G, sub, rows), level_pairs(xs, y, G, precision, sub,
                                                                                       rows))]


def decayed_grams_bwd(pairs, y, G, precision, rows, sub, bounded_block=None):
  """Backward of `decayed_grams`. pairs: [(x, dM)], dM [C, C] strictly lower; rows and bounded_block as there.

  Returns ([dx], dy, dG) where dG [C, K] is the gradient with respect to the cumsum G: each pair
  (r, c) adds its term to row r and subtracts it from row c, so the decay of a pair reaches exactly
  the g it spans once dG is reverse-cumsummed. The bounded factors give the same terms (their product is the
  pair's decay), so the attribution is as exact.
  """
  C, K = G.shape
  sub = min(sub, C)
  if bounded_block:
    dxs, dy = [jnp.zeros((C, K), jnp.float32) for _ in pairs], jnp.zeros((C, K), jnp.float32)
  else:
    dxs, dy = block_pairs_bwd(pairs, y, G, sub, rows)
  for mask, row_factor, col_factor in levels(G, sub, rows[1], bounded_block):
    y_col = y * col_factor
    for i, (x, dm) in enumerate(pairs):
      dm = jnp.where(mask, dm, 0.0)
      dxs[i] += row_factor * dot(dm, y_col, precision)
      dy += col_factor * dot(dm.T, x * row_factor, precision)
  dG = -y * dy
  for (x, _), dx in zip(pairs, dxs):
    dG += x * dx
  return dxs, dy, dG


def unit_lower_inverse(T, dots):
  """(I + T)^-1 for a strictly lower T [C, C], exact to fp32.

  The diagonal blocks are merged level by level (2, 4, ..., C): with A the inverse of the block
  diagonal of size b/2, the b-blocks are A - A (T on the level's pairs) A, the exact block inverse
  [[A11, 0], [-A22 T21 A11, A22]] (no powers of T, so no growth to cancel). The 2-blocks are I - T
  there, exactly, without a dot; the larger levels are one-pass TF32. One Newton step in near-fp32
  then squares the relative error E = I - (I + T) A (TF32 leaves ~1e-4): A <- A + A E, so
  I - (I + T) A becomes E^2.
  """
  C = T.shape[0]
  eye = (iota((C, C), 0) == iota((C, C), 1)).astype(jnp.float32)
  A = level_inverse(T, dots)
  residual = eye - A - dot(T, A, dots.near)
  return A + dot(A, residual, dots.near)


def level_inverse(T, dots):
  """The level merges of `unit_lower_inverse` without its Newton step: (I + T)^-1 to TF32 accuracy."""
  C = T.shape[0]
  A = (iota((C, C), 0) == iota((C, C), 1)).astype(jnp.float32) - jnp.where(pair_mask(C, 2), T, 0.0)
  for b in reversed(block_sizes(C, 2)):
    A = A - dot(A, dot(jnp.where(pair_mask(C, b), T, 0.0), A, dots.tf32), dots.tf32)
  return A


def lower_ones(C, strict, loop_index=0):
  """[C, C] 0/1: row t sums rows r < t (strict) or r <= t of what it multiplies. Inside a loop, pass
  its index: the matrix is then rebuilt where it is used instead of held in registers across the loop."""
  r, c = iota((C, C), 0), iota((C, C), 1)
  return (((c < r) if strict else (c <= r)) & (loop_index >= 0)).astype(jnp.float32)
