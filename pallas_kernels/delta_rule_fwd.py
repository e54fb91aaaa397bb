"""Pallas (Triton) forward kernels for the chunked generalized delta rule (DESIGN.md section 2).

Four launches:
  chunk_cumsum grid (B, H, N): G, the cumsum of g within each chunk, which every later kernel reads.
  gram_solve  grid (B, H, N): per chunk, the decayed Gram matrices T and Aqk and the exact fp32
              inverse A = (I + T)^-1 (chunk_math has the tree of decay factors that keeps every
              exponent <= 0, and the one or two dots per gram a lower bound on g allows; a decay shared by
              all channels, GDN's, needs only plain dots times one [C, C] decay matrix, faster for GDN's
              op forward: benchmarks/ops/README.md, launch settings).
  solved      grid (B, H, N): Y = A (e * exp(G)), U = A z and the chunk's decays for the state passes:
              q~ = scale * q * exp(G), u~ = u * exp(G_C - G) and exp(G_C).
  state_pass  grid (B, H, V / block_v): sequential over chunks, carries the fp32 state tile,
              R = U - Y S, o = q~ S + Aqk R, S <- exp(G_C) S + u~^T R.
(`intra_chunk` is gram_solve and solved.) Splitting the per-chunk work in two launches, A going through memory,
is faster on the H200 than one launch doing both (benchmarks/ops/README.md, launch settings):
each launch holds fewer registers.

The decays are formed once per chunk in `solved` rather than in every value tile of the state
passes: those loops then read no g and take no exp. q~ and u~ travel in the io dtype, which is the
rounding the state passes' dots gave them anyway.

`intra_chunk` reads u, e and z as a `mixer_inputs.Form` says: formed arrays (`FORMED`: u, z, e), or a mixer's
k, v and gates, from which each block forms them in registers (and normalizes q and k) as it loads them.

Shapes (T padded to N * C, K and V powers of two >= 16): q, u, e, k: [B, T, H, K]; z, v: [B, T, H, V];
g: [B, T, H, K] fp32 log decay, which the kernels read as G = `chunk_cumsum(g)`; initial_state: [B, H, K, V]
fp32; exp(G_C): [B, N, H, K] fp32. For the backward, intra_chunk can also return A [B, T, H, C] fp32 and
state_pass the state entering every chunk [B, H, N, K, V], stored in `saved_state_dtype` (bf16 for bf16 inputs).

A decay shared by all channels (GDN's one number per head) travels as g and G [B, T, H] and exp(G_C) [B, N, H]:
every kernel, backward included, takes its rank as the sign and reads one decay per row instead of K.

Between the kernels the per-chunk tensors travel as one `ChunkTensors`, selected by name. Each launching function
takes its launch settings as one frozen dataclass (`ChunkCumsumSettings`, `IntraChunkSettings`,
`StatePassSettings`: `launch.LaunchSettings`; None: its `defaults` for the shape, the rule beside the measurement it
came from).
"""

import dataclasses
import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels import chunk_math as cm
from pallas_kernels.launch import Shape, one_at_a_time, require
from pallas_kernels.mixer_inputs import FORMED, row_norms


class ChunkTensors(NamedTuple):
  """What `intra_chunk` gives the state passes (DESIGN.md section 2's names), [B, T, H, D] in the io dtype unless
  said: Y = A (e * exp(G)) [.., K]; U = A z [.., V]; Aqk [.., C], the decayed q-u Gram matrix (lower, with the
  diagonal); q_decayed = scale * q * exp(G) (q~) and u_decayed = u * exp(G_C - G) (u~) [.., K];
  decay_last = exp(G_C) [B, N, H, K] fp32 ([B, N, H] with one decay per head); A = (I + T)^-1 [.., C] fp32 when
  intra_chunk saves it, else None."""
  Y: jax.Array
  U: jax.Array
  Aqk: jax.Array
  q_decayed: jax.Array
  u_decayed: jax.Array
  decay_last: jax.Array
  A: Optional[jax.Array] = None


def columns(ref, i, width):
  """Column block i of a [rows, D] ref, as fp32."""
  return ref[:, pl.ds(i * width, width)].astype(jnp.float32)


def gather_rows(x, at):
  """x [C] at the index vector at [n], as a masked sum (registers cannot be indexed)."""
  return jnp.sum(jnp.where(cm.iota((at.shape[0], x.shape[0]), 1) == at[:, None], x[None, :], 0.0), axis=1)


def norms(form, q_ref, k_ref, width, real_ref=None):
  """(1 / ||q||, 1 / ||k||) per row when the form normalizes them, else (None, None); with real_ref (a chunk's
  [C] int32 padding mask, 0 on padding) both times 0 on padding, so that a padding token reads and writes nothing."""
  q_norm, k_norm = (row_norms(q_ref, width), row_norms(k_ref, width)) if form.l2norm else (None, None)
  if real_ref is None:
    return q_norm, k_norm
  real = (real_ref[...] != 0).astype(jnp.float32)
  return tuple(real if x is None else x * real for x in (q_norm, k_norm))


def document_spec(C):
  """[B, T] int32 arrays of packed sequences (the chunk-local document counts, the decay's keep mask, the padding
  mask), one chunk per program of a (B, H, N) grid."""
  return pl.BlockSpec((pl.squeezed, C), lambda b, h, n: (b, n))


class DocumentMasks(NamedTuple):
  """Packed documents in one chunk, from documents [C] (at each row, the document starts at or before it in the
  chunk): every decay that spans a start is 0, so each factor of the chunked form is masked by what it spans.
  same [C, C]: rows r, c in one document (the pairs of T and Aqk, exp(G_r - G_c)); sees_state [C, 1]: no start
  up to row r (exp(G_r), the state entering the chunk); in_last [C, 1]: row r in the chunk's last document
  (exp(G_C - G_r), what it writes into the state leaving); carries: no start in the chunk (exp(G_C)). Every mask
  is 0/1 per row or pair, the same for all channels, so the grams are masked after their sum over channels and
  no exponent changes."""
  same: jax.Array
  sees_state: jax.Array
  in_last: jax.Array
  carries: jax.Array


def document_masks(documents_ref):
  """The `DocumentMasks` of a chunk from its [C] documents ref; None for None (unpacked)."""
  if documents_ref is None:
    return None
  d = documents_ref[...]
  last = documents_ref[documents_ref.shape[0] - 1]
  return DocumentMasks(same=d[:, None] == d[None, :], sees_state=(d == 0)[:, None], in_last=(d == last)[:, None],
                       carries=last == 0)


def masked(mask, x):
  """x where mask, else 0; x unchanged when there is no mask (unpacked)."""
  return x if mask is None else jnp.where(mask, x, 0.0)


def split_documents(refs, packed):
  """(documents ref or None, the other refs): a packed kernel's documents ref comes first of refs (and so, after
  it, does an optional padding mask ref)."""
  return (refs[0], refs[1:]) if packed else (None, refs)


def _gram_solve_kernel(q_ref, G_ref, *refs, form, scale, key_block, sub_block, scalar_decay, bounded_block, packed,
                       padded, interpret):
  """One chunk: A = (I + T)^-1 and Aqk [C, C], key_block key channels at a time. The pairs inside sub-blocks
  are summed over the key blocks as [C, sub_block] and placed once at the end. scalar_decay: G_ref [C] holds
  the head's one decay, so the grams are plain dots times one [C, C] decay matrix. bounded_block: g >= a
  lower bound, every pair in one or two dots per gram (`chunk_math.levels`), no sub-blocks. packed: refs start
  with the chunk's documents, and pairs across documents are 0; padded: then its padding mask (`norms`)."""
  documents_ref, refs = split_documents(refs, packed)
  real_ref, refs = split_documents(refs, padded)
  same = None if documents_ref is None else document_masks(documents_ref).same
  *arrays, A_ref, Aqk_ref = refs
  dots = cm.precisions(Aqk_ref.dtype, interpret)
  C, K = q_ref.shape
  kb = min(key_block, K)
  q_norm, k_norm = norms(form, q_ref, arrays[0], kb, real_ref)
  q_scale = scale if q_norm is None else scale * q_norm[:, None]
  if scalar_decay:
    _scalar_grams(q_ref, G_ref, arrays, A_ref, Aqk_ref, form, q_scale, k_norm, kb, dots, same)
    return
  sub = min(sub_block, C)
  eye = cm.iota((C, C), 0) == cm.iota((C, C), 1)

  def gram_block(i, acc):
    keys = pl.ds(i * kb, kb)
    u_rows = lambda at: form.take(arrays, at, keys, ("u",), None if k_norm is None else gather_rows(k_norm, at))[0]
    rows = (u_rows, lambda at: G_ref[at, keys])
    G = G_ref[:, keys]
    q = columns(q_ref, i, kb) * q_scale
    u, e = form.take(arrays, slice(None), keys, ("u", "e"), k_norm)
    D = () if bounded_block else cm.block_pairs([e, q], G, sub, rows)
    M_T, M_qk = cm.level_pairs([e, q], u, G, dots.io, sub, rows, bounded_block)
    diag = jnp.where(eye, jnp.sum(q * u, axis=1, keepdims=True), 0.0)
    return *(a + d for a, d in zip(acc, D)), acc[-2] + M_T, acc[-1] + M_qk + diag

  blocks, square = jnp.zeros((C, sub), jnp.float32), jnp.zeros((C, C), jnp.float32)
  # Bounded: (T, Aqk); else (D_T, D_qk, M_T, M_qk), the sub-blocks' pairs apart from the levels', each placed where
  # it is used (Aqk's after the inverse, so that it is not held through it).
  init = (square, square) if bounded_block else (blocks, blocks, square, square)
  *D, M_T, M_qk = jax.lax.fori_loop(0, K // kb, gram_block, init)
  place = lambda i, M: M if bounded_block else cm.place_blocks(D[i]) + M
  A_ref[...] = cm.unit_lower_inverse(masked(same, place(0, M_T)), dots)
  Aqk_ref[...] = masked(same, place(1, M_qk)).astype(Aqk_ref.dtype)


def _scalar_grams(q_ref, G_ref, arrays, A_ref, Aqk_ref, form, q_scale, k_norm, kb, dots, same):
  """gram_solve for a decay shared by all channels: T = (e u^T) * D and Aqk = (q u^T) * D with
  D[r, c] = exp(G_r - G_c), taken only on c <= r (masked before exp, so every exponent is <= 0) and, packed
  (same not None), only on pairs of one document."""
  C, K = q_ref.shape

  def gram_block(i, acc):
    keys = pl.ds(i * kb, kb)
    u, e = form.take(arrays, slice(None), keys, ("u", "e"), k_norm)
    u_t = u.T
    return acc[0] + cm.dot(e, u_t, dots.io), acc[1] + cm.dot(columns(q_ref, i, kb) * q_scale, u_t, dots.io)

  square = jnp.zeros((C, C), jnp.float32)
  e_u, q_u = jax.lax.fori_loop(0, K // kb, gram_block, (square, square))
  G = G_ref[...]
  r, c = cm.iota((C, C), 0), cm.iota((C, C), 1)
  pairs = lambda mask: mask if same is None else mask & same
  D = jnp.exp(jnp.where(pairs(c <= r), G[:, None] - G[None, :], 0.0))
  A_ref[...] = cm.unit_lower_inverse(jnp.where(pairs(c < r), e_u * D, 0.0), dots)
  Aqk_ref[...] = jnp.where(pairs(c <= r), q_u * D, 0.0).astype(Aqk_ref.dtype)


def chunk_decays(G_ref, keys, scalar_decay):
  """G [C, kb]: a chunk's cumsum at the channels `keys`; with scalar_decay (G_ref [C], one decay per head) [C, 1],
  the same for every channel."""
  return G_ref[...][:, None] if scalar_decay else G_ref[:, keys]


def last_decays(G_ref, keys, scalar_decay):
  """G_C [kb]: the chunk's last row of G at the channels `keys`; with scalar_decay a scalar (`chunk_decays`)."""
  C = G_ref.shape[0]
  return G_ref[C - 1] if scalar_decay else G_ref[C - 1, keys]


def _solved_kernel(A_ref, q_ref, G_ref, *refs, form, scale, key_block, value_block, scalar_decay, packed, padded,
                   interpret):
  """One chunk, from the inverse A: Y = A (e * exp(G)), U = A z, and the decays q~, u~, exp(G_C),
  key_block / value_block channels at a time; packed: refs start with the chunk's documents (`DocumentMasks`);
  scalar_decay: G_ref [C] and decay_last_ref a scalar (`chunk_decays`)."""
  documents_ref, refs = split_documents(refs, packed)
  real_ref, refs = split_documents(refs, padded)
  masks = document_masks(documents_ref) or DocumentMasks(None, None, None, None)
  *arrays, Y_ref, U_ref, q_decayed_ref, u_decayed_ref, decay_last_ref = refs
  io = cm.precisions(U_ref.dtype, interpret).io
  C, K = q_ref.shape
  V = U_ref.shape[-1]
  kb, vb = min(key_block, K), min(value_block, V)
  A = A_ref[...]
  q_norm, k_norm = norms(form, q_ref, arrays[0], kb, real_ref)
  q_scale = scale if q_norm is None else scale * q_norm[:, None]

  def y_block(i, carry):
    keys = pl.ds(i * kb, kb)
    G = chunk_decays(G_ref, keys, scalar_decay)
    exp_G = masked(masks.sees_state, jnp.exp(G))
    u, e = form.take(arrays, slice(None), keys, ("u", "e"), k_norm)
    Y_ref[:, keys] = cm.dot(A, e * exp_G, io).astype(Y_ref.dtype)
    G_C = last_decays(G_ref, keys, scalar_decay)
    q_decayed_ref[:, keys] = (columns(q_ref, i, kb) * q_scale * exp_G).astype(q_decayed_ref.dtype)
    to_end = (G_C if scalar_decay else G_C[None, :]) - G
    u_decayed_ref[:, keys] = (u * masked(masks.in_last, jnp.exp(to_end))).astype(u_decayed_ref.dtype)
    if not scalar_decay:
      decay_last_ref[keys] = masked(masks.carries, jnp.exp(G_C))
    return carry

  if scalar_decay:
    decay_last_ref[...] = masked(masks.carries, jnp.exp(G_ref[C - 1]))

  def u_block(j, carry):
    values = pl.ds(j * vb, vb)
    U_ref[:, values] = cm.dot(A, form.take(arrays, slice(None), values, ("z",))[0], io).astype(U_ref.dtype)
    return carry

  jax.lax.fori_loop(0, K // kb, y_block, 0)
  jax.lax.fori_loop(0, V // vb, u_block, 0)


def chunk_decay(decay_last_ref, n):
  """exp(G_C) of chunk n as a factor of the [K, block_v] state: [K, 1] per channel, or the head's one number."""
  decay = decay_last_ref[n]
  return decay[:, None] if decay.ndim else decay


def state_dot(io_dtype, interpret):
  """Dots of the state passes: near-fp32 for fp32 inputs; bf16 operands with fp32 accumulation for bf16."""
  return functools.partial(cm.dot, precision=cm.precisions(io_dtype, interpret).io)


def saved_state_dtype(io_dtype):
  """The dtype the backward stores every chunk's state and its gradient ([B, H, N, K, V]), R and dR ([B, T, H, V])
  in: bf16 where the io products take bf16 operands (`chunk_math.precisions`), since every dot that reads them rounds
  them to bf16 anyway; fp32 otherwise. The carried state inside the passes is fp32 either way."""
  bf16 = cm.precisions(io_dtype, interpret=False).io == cm.BF16_OPERANDS
  return jnp.dtype(jnp.bfloat16 if bf16 else jnp.float32)


def _state_pass_kernel(q_decayed_ref, u_decayed_ref, decay_last_ref, Y_ref, U_ref, Aqk_ref, h0_ref, o_ref, ht_ref,
                       *saved_refs, chunk_size, num_chunks, sdot):
  f32 = jnp.float32
  C = chunk_size

  def chunk(n, state):
    t = pl.ds(n * C, C)
    if saved_refs:
      saved_refs[0][n] = state.astype(saved_refs[0].dtype)
    R = U_ref[t, :].astype(f32) - sdot(Y_ref[t, :], state)
    if saved_refs:
      saved_refs[1][t, :] = R.astype(saved_refs[1].dtype)
    o_ref[t, :] = (sdot(q_decayed_ref[t, :], state) + sdot(Aqk_ref[t, :], R)).astype(o_ref.dtype)
    return chunk_decay(decay_last_ref, n) * state + sdot(u_decayed_ref[t, :].T, R)

  ht_ref[...] = jax.lax.fori_loop(0, num_chunks, chunk, h0_ref[...].astype(f32))


def _chunk_cumsum_kernel(g_ref, *refs):
  *keep_ref, G_ref = refs
  g = g_ref[...].astype(jnp.float32)
  if keep_ref:  # packed documents: g counts only where keep is nonzero
    keep = keep_ref[0][...] != 0
    g = jnp.where(keep[:, None] if g.ndim == 2 else keep, g, 0.0)
  G_ref[...] = jnp.cumsum(g, axis=0)


@dataclasses.dataclass(frozen=True)
class ChunkCumsumSettings:
  """Launch settings of `chunk_cumsum` (one chunk of one head per program): its warps."""
  num_warps: int

  @classmethod
  def defaults(cls, shape=None):
    """4 warps at every shape."""
    # 2, 4 and 8 warps are within a few percent of each other at chunk 32 and 64 on the H200
    # (benchmarks/ops/README.md, launch settings).
    return cls(num_warps=4)

  @classmethod
  def candidates(cls, shape=None):
    return one_at_a_time(cls, shape, num_warps=(2, 8))


def chunk_cumsum(g, chunk_size, interpret=False, *, keep=None, settings=None):
  """G [B, T, H, K] fp32: the cumsum of g within each chunk (T a multiple of chunk_size), one chunk per program;
  g [B, T, H] (one decay per head) gives G [B, T, H].
  Every kernel reads G rather than summing g itself, so all of them see the same rounding, and rows of G are
  plain loads (a Pallas launch rather than XLA's cumsum fusion: benchmarks/ops/README.md, launch settings).
  keep: None, or for packed documents [B, T] int32, nonzero where g counts (g is taken as 0 elsewhere: padding and
  document starts), so that g needs no masking pass of its own. settings: `ChunkCumsumSettings` (None: its defaults)."""
  settings = ChunkCumsumSettings.defaults() if settings is None else settings
  B, T, H = g.shape[:3]
  K = g.shape[3] if g.ndim == 4 else None
  specs, arrays = [chunk_spec(chunk_size, K)], (g,)
  if keep is not None:
    specs, arrays = specs + [document_spec(chunk_size)], arrays + (keep,)
  return pl.pallas_call(_chunk_cumsum_kernel, out_shape=jax.ShapeDtypeStruct(g.shape, jnp.float32),
                        grid=(B, H, T // chunk_size), in_specs=specs,
                        out_specs=chunk_spec(chunk_size, K), compiler_params=params(settings.num_warps),
                        interpret=interpret, name="delta_rule_chunk_cumsum")(*arrays)


def params(num_warps, num_stages=1):
  return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def chunk_spec(C, d=None):
  """[B, T, H, d] arrays ([B, T, H] when d is None), one chunk per program of a (B, H, N) grid."""
  if d is None:
    return pl.BlockSpec((pl.squeezed, C, pl.squeezed), lambda b, h, n: (b, n, h))
  return pl.BlockSpec((pl.squeezed, C, pl.squeezed, d), lambda b, h, n: (b, n, h, 0))


def chunk_row_spec(K=None):
  """[B, N, H, K] arrays (one row per chunk), one row per program of a (B, H, N) grid; [B, N, H] (K None), one
  number per program."""
  if K is None:
    return pl.BlockSpec((pl.squeezed,) * 3, lambda b, h, n: (b, n, h))
  return pl.BlockSpec((pl.squeezed, pl.squeezed, pl.squeezed, K), lambda b, h, n: (b, n, h, 0))


@dataclasses.dataclass(frozen=True)
class IntraChunkSettings:
  """Launch settings of `intra_chunk`. gram_solve: key_block key channels per step (its [C, key_block] tiles stay
  in registers), the pairs inside blocks of sub_block rows formed elementwise (`chunk_math`), num_warps warps and
  num_stages Triton pipelining stages of its channel-block loop (bounded_stages with a lower_bound, whose grams are
  one or two dots a block). solved: solve_key_block / solve_value_block channels per step, solve_warps warps,
  solve_stages stages. A block wider than K or V takes all of it."""
  key_block: int
  sub_block: int
  num_warps: int
  solve_key_block: int
  solve_value_block: int
  solve_warps: int
  num_stages: int
  solve_stages: int
  bounded_stages: int

  @classmethod
  def defaults(cls, shape):
    """The settings chosen from the H200 sweeps at chunk 32 and 64 (they read shape.chunk_size alone); chunk 16
    takes chunk 32's, untimed."""
    # Key blocks, warps and stages from the H200 sweeps; bounded_stages, and sub-blocks of 2 rows at chunk <= 32,
    # from the H100's at chunk 32 (benchmarks/ops/README.md, launch settings).
    chunk_size, = require(shape, cls.__name__, "chunk_size")
    small = chunk_size <= 32
    return cls(key_block=32, sub_block=2 if small else 4, num_warps=2 if small else 4, solve_key_block=64,
               solve_value_block=64, solve_warps=4, num_stages=1, solve_stages=2, bounded_stages=2)

  @classmethod
  def candidates(cls, shape):
    return one_at_a_time(cls, shape, key_block=(16, 64), sub_block=(2, 4, 8), num_warps=(2, 4, 8), num_stages=(2,),
                         bounded_stages=(1, 3),
                         solve_key_block=(32,), solve_value_block=(32,), solve_warps=(8,), solve_stages=(1, 3))


def chunk_shape(q, v, chunk_size, io_dtype):
  """The `Shape` of the chunk kernels' launches: q [B, T, H, K], v [.., V] (any value-side array) in io_dtype."""
  B, T, H, K = q.shape
  return Shape(B=B, T=T, H=H, K=K, V=v.shape[-1], dtype=jnp.dtype(io_dtype).name, chunk_size=chunk_size)


@functools.partial(jax.jit, static_argnames=("form", "io_dtype", "scale", "chunk_size", "save_inverse", "lower_bound",
                                             "settings", "interpret"))
def intra_chunk(q, arrays, G, *, scale, chunk_size, form=FORMED, io_dtype=None, save_inverse=False, lower_bound=None,
                documents=None, real=None, settings=None, interpret=False):
  """G = `chunk_cumsum(g)`, [B, T, H, K] or [B, T, H] (one decay per head); arrays: what `form` builds u, e, z
  from (by default the formed (u, z, e)).
  Returns the `ChunkTensors` Y, U, Aqk, q_decayed, u_decayed (in io_dtype, by default that of arrays[1], the
  value-side array), decay_last, and with save_inverse A (else A is None).
  documents: None, or for packed sequences [B, T] int32, at each token the document starts at or before it in its
  chunk (the state is reset before a start, so its g has no effect; the op passes 0): both launches read it and mask
  the decays that span a start (`DocumentMasks`). Without it the kernels are the unpacked ones. real: None, or with
  documents [B, T] int32, 0 on padding: both launches zero q and k there (a form whose u and e vanish with k then
  makes a padding token inert without a pass over q and k).

  lower_bound: None, or the caller's promise that every g >= lower_bound (`chunk_math.check_lower_bound` at
  chunk_size, per-channel G only): gram_solve then forms each gram with one or two dots (`chunk_math.levels`).

  Two launches: gram_solve writes A and Aqk; solved reads A. settings: `IntraChunkSettings` (None: its defaults
  at chunk_size). With G [B, T, H] gram_solve forms the grams as plain dots times one decay matrix, and decay_last
  is [B, N, H]."""
  io_dtype = jnp.dtype(io_dtype or arrays[1].dtype)
  s = IntraChunkSettings.defaults(chunk_shape(q, arrays[1], chunk_size, io_dtype)) if settings is None else settings
  B, T, H, K = q.shape
  V = arrays[1].shape[-1]
  form.check(K, V)
  C = chunk_size
  scalar_decay = G.ndim == 3
  bounded_block = cm.check_lower_bound(lower_bound, chunk_size, scalar_decay)
  decays = None if scalar_decay else K
  key = jax.ShapeDtypeStruct((B, T, H, K), io_dtype)
  grid = (B, H, T // C)
  specs = [chunk_spec(C, None if kind == "head" else x.shape[-1]) for kind, x in zip(form.kinds, arrays)]
  packed, padded = documents is not None, real is not None
  if padded and not packed:
    raise ValueError("real: only with documents (packed sequences)")
  if padded:
    specs, arrays = [document_spec(C)] + specs, (real, *arrays)
  if packed:
    specs, arrays = [document_spec(C)] + specs, (documents, *arrays)
  A, Aqk = pl.pallas_call(
      functools.partial(_gram_solve_kernel, form=form, scale=scale, key_block=s.key_block, sub_block=s.sub_block,
                        scalar_decay=scalar_decay, bounded_block=bounded_block, packed=packed, padded=padded,
                        interpret=interpret),
      out_shape=(jax.ShapeDtypeStruct((B, T, H, C), jnp.float32), jax.ShapeDtypeStruct((B, T, H, C), io_dtype)),
      grid=grid, in_specs=[chunk_spec(C, K), chunk_spec(C, decays)] + specs, out_specs=(chunk_spec(C, C),) * 2,
      compiler_params=params(s.num_warps, s.num_stages if bounded_block is None else s.bounded_stages),
      interpret=interpret,
      name="delta_rule_gram_solve")(q, G, *arrays)
  Y, U, q_decayed, u_decayed, decay_last = pl.pallas_call(
      functools.partial(_solved_kernel, form=form, scale=scale, key_block=s.solve_key_block,
                        value_block=s.solve_value_block, scalar_decay=scalar_decay, packed=packed, padded=padded,
                        interpret=interpret),
      out_shape=(key, jax.ShapeDtypeStruct((B, T, H, V), io_dtype), key, key,
                 jax.ShapeDtypeStruct((B, T // C, H) + (() if scalar_decay else (K,)), jnp.float32)),
      grid=grid,
      in_specs=[chunk_spec(C, C), chunk_spec(C, K), chunk_spec(C, decays)] + specs,
      out_specs=(chunk_spec(C, K), chunk_spec(C, V), chunk_spec(C, K), chunk_spec(C, K), chunk_row_spec(decays)),
      compiler_params=params(s.solve_warps, s.solve_stages), interpret=interpret,
      name="delta_rule_solved")(A, q, G, *arrays)
  return ChunkTensors(Y=Y, U=U, Aqk=Aqk, q_decayed=q_decayed, u_decayed=u_decayed, decay_last=decay_last,
                      A=A if save_inverse else None)


def seq_spec(T, d, block=None):
  """[B, T, H, d] arrays whole along T for a (B, H, d / block) grid, tiled along d when block is given."""
  if block is None:
    return pl.BlockSpec((pl.squeezed, T, pl.squeezed, d), lambda b, h, j: (b, 0, h, 0))
  return pl.BlockSpec((pl.squeezed, T, pl.squeezed, block), lambda b, h, j: (b, 0, h, j))


def chunk_rows_spec(N, K=None):
  """[B, N, H, K] arrays ([B, N, H] when K is None) whole along N for a (B, H, d / block) grid."""
  if K is None:
    return pl.BlockSpec((pl.squeezed, N, pl.squeezed), lambda b, h, j: (b, 0, h))
  return pl.BlockSpec((pl.squeezed, N, pl.squeezed, K), lambda b, h, j: (b, 0, h, 0))


def decays_spec(chunks, N):
  """The spec of chunks.decay_last ([B, N, H, K], or [B, N, H] with one decay per head) for the state passes."""
  return chunk_rows_spec(N, chunks.decay_last.shape[3] if chunks.decay_last.ndim == 4 else None)


def state_spec(K, block_v):
  return pl.BlockSpec((pl.squeezed, pl.squeezed, K, block_v), lambda b, h, j: (b, h, 0, j))


def states_spec(N, K, block_v):
  return pl.BlockSpec((pl.squeezed, pl.squeezed, N, K, block_v), lambda b, h, j: (b, h, 0, 0, j))


# Shared memory one Triton program may use, by CUDA compute capability (the opt-in per-block maxima); others
# get the smallest of recent GPUs.
SHARED_MEMORY = {"9.0": 232_448, "8.0": 166_912, "8.7": 166_912}
SHARED_MEMORY_DEFAULT = 101_376


def shared_memory_bytes():
  return SHARED_MEMORY.get(getattr(jax.devices()[0], "compute_capability", None), SHARED_MEMORY_DEFAULT)


@dataclasses.dataclass(frozen=True)
class StatePassSettings:
  """Launch settings of `state_pass` (grid B x H x V / block_v): block_v value columns per program, num_warps,
  and num_stages Triton software-pipelining stages of the chunk loop (the next chunks' loads overlap this chunk's
  dots)."""
  block_v: int
  num_warps: int
  num_stages: int

  @classmethod
  def defaults(cls, shape, *, block_v=None, num_stages=None, shared_memory=None):
    """The rule for q~ [B, T, H, K] and U [B, T, H, V] in the io dtype at chunk C (shape: B, H, K, V, dtype and
    chunk_size). block_v and num_stages given are kept (block_v at most V) and the stages follow block_v.

    block_v: the widest of 64, 32, 16 that leaves at least 128 programs (else 16). Every program of a head reads
    that head's whole [C, K] tiles, so narrow tiles cost reads; wide ones leave SMs idle.
    num_stages: each stage holds the next chunk's [C, K] q~, u~, Y, [C, C] Aqk and [C, block_v] U or dO,
    C (3K + C + block_v) itemsize bytes of shared memory; up to 3, as many as fit with 16 KiB to spare, at least 1
    (a request above the limit fails at compile time). shared_memory: the bytes one program may use (None: those
    of this machine's first device, `shared_memory_bytes`)."""
    # block_v, warps and stages: both state passes swept on the H200, where 2 and 8 warps were no faster than 4 and a
    # request above the shared-memory limit failed to compile (benchmarks/ops/README.md, launch settings).
    chunk_size, B, H, K, V, io_dtype = require(shape, cls.__name__, "chunk_size", "B", "H", "K", "V", "dtype")
    if block_v is None:
      block_v = next((bv for bv in (64, 32) if B * H * (V // bv) >= 128), 16)
    block_v = min(block_v, V)
    if num_stages is None:
      per_stage = chunk_size * (3 * K + chunk_size + block_v) * jnp.dtype(io_dtype).itemsize
      budget = (shared_memory or shared_memory_bytes()) - 16 * 1024
      num_stages = int(min(3, max(1, budget // per_stage)))
    return cls(block_v=block_v, num_warps=4, num_stages=num_stages)

  @classmethod
  def candidates(cls, shape):
    """block_v 16, 32 and 64 (each with the stages that fit it), 2 and 8 warps, and fewer stages than fit."""
    fewer = range(1, cls.defaults(shape).num_stages)
    return one_at_a_time(cls, shape, block_v=(16, 32, 64), num_warps=(2, 8), num_stages=fewer)


def check_block_v(settings, V):
  """ValueError unless settings.block_v tiles the V value columns."""
  if V % settings.block_v:
    raise ValueError(f"settings.block_v: expected a divisor of V = {V}, got {settings.block_v}")


@functools.partial(jax.jit, static_argnames=("chunk_size", "save_states", "settings", "interpret"))
def state_pass(chunks, initial_state, *, chunk_size, save_states=False, settings=None, interpret=False):
  """Sequential over chunks, reading the `ChunkTensors` from `intra_chunk` but A: o [B, T, H, V] in U's dtype,
  the final state [B, H, K, V] fp32, and with save_states the state entering each chunk [B, H, N, K, V] in
  `saved_state_dtype` (bf16 for bf16 io; carried in fp32, rounded as it is stored) and R = U - Y S [B, T, H, V] in
  that dtype too.
  settings: `StatePassSettings` (None: its rule for these shapes)."""
  c = chunks
  B, T, H, K = c.q_decayed.shape
  V = c.U.shape[-1]
  io = c.U.dtype
  N = T // chunk_size
  s = StatePassSettings.defaults(chunk_shape(c.q_decayed, c.U, chunk_size, io)) if settings is None else settings
  check_block_v(s, V)
  block_v = s.block_v
  out_shape = [jax.ShapeDtypeStruct((B, T, H, V), io), jax.ShapeDtypeStruct((B, H, K, V), jnp.float32)]
  out_specs = [seq_spec(T, V, block_v), state_spec(K, block_v)]
  if save_states:
    out_shape += [jax.ShapeDtypeStruct((B, H, N, K, V), saved_state_dtype(io)),
                  jax.ShapeDtypeStruct((B, T, H, V), saved_state_dtype(io))]
    out_specs += [states_spec(N, K, block_v), seq_spec(T, V, block_v)]
  return pl.pallas_call(
      functools.partial(_state_pass_kernel, chunk_size=chunk_size, num_chunks=N, sdot=state_dot(io, interpret)),
      out_shape=tuple(out_shape),
      grid=(B, H, V // block_v),
      in_specs=[seq_spec(T, K)] * 2 + [decays_spec(c, N), seq_spec(T, K), seq_spec(T, V, block_v),
                                       seq_spec(T, chunk_size), state_spec(K, block_v)],
      out_specs=tuple(out_specs),
      compiler_params=params(s.num_warps, s.num_stages),
      interpret=interpret,
      name="delta_rule_state_pass",
  )(c.q_decayed, c.u_decayed, c.decay_last, c.Y, c.U, c.Aqk, initial_state)


SETTINGS = (ChunkCumsumSettings, IntraChunkSettings, StatePassSettings)


def delta_rule_fwd(q, u, e, z, g, initial_state, *, scale, chunk_size=64, lower_bound=None, interpret=False):
  """Returns (o [B, T, H, V] in z.dtype, final state [B, H, K, V] fp32).

  q, u, e: [B, T, H, K]; z: [B, T, H, V]; g: [B, T, H, K] or [B, T, H] (one decay per head) fp32;
  initial_state: [B, H, K, V] fp32.
  T a multiple of chunk_size; K and V powers of two >= 16; chunk_size in {16, 32, 64}; lower_bound: None or the
  caller's promise g >= lower_bound (`intra_chunk`).
  """
  G = chunk_cumsum(g, chunk_size, interpret)
  chunks = intra_chunk(q, (u, z, e), G, scale=scale, chunk_size=chunk_size, lower_bound=lower_bound,
                       interpret=interpret)
  return state_pass(chunks, initial_state, chunk_size=chunk_size, interpret=interpret)
