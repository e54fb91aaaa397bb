"""Pallas (Triton) backward kernels for the chunked generalized delta rule (DESIGN.md section 2).

Three launches, the forward's in reverse:
  state_pass_bwd  grid (B, H, V / block_v): sequential over chunks from the last, carries dS (the
                  gradient of the state leaving a chunk, fp32) and writes dR = Aqk^T dO + u~ dS and every
                  chunk's dS (in `saved_state_dtype`, as the forward's saved states);
                  dS <- exp(G_C) dS + q~^T dO - Y^T dR (the forward's `ChunkTensors`).
  intra_chunk_bwd grid (B, H, N), passes 1 to 3: per chunk, with R and the state S entering it (saved
                  by the forward) and dS: the products that contract V (dz = A^T dR, dA = dR z^T; per key
                  block dq~ = dO S^T, du~ = R dS^T, dY = -dR S^T, d exp(G_C), each state block read once),
                  the WY inverse (dT = -A^T dA A^T, the channel gates inside dA) and dAqk = dO R^T.
                  Writes dz, dT and dAqk, and the terms of dq, du, de (fp32 `parts`) and of dg so far.
  pair_bwd        grid (B, H, N, K / key block), pass 4: the decayed Gram matrices' gradients for one key
                  block, added to those terms: dq, du, de and dg (in place); with a lower bound on g and
                  `bounded_pairs`, those of the forward's one or two dots per gram (`chunk_math.levels`). With
                  one decay per head (G and dg [B, T, H]) grid (B, H, N): plain dots with dT and dAqk times one
                  [C, C] decay matrix, every key block in one program, since all of them add to the head's one dg.
Splitting pass 4 off is faster on the H200 than one launch (benchmarks/ops/README.md, launch settings).

d/dg: every term is attributed to exactly the log decays it spans (pair terms through
`chunk_math.decayed_grams_bwd`, then one reverse cumsum, and the terms of u * exp(G_C - G) through
an exclusive cumsum), both as 0/1 dots, never as a difference of two large sums, so a gradient as
small as exp(-30) keeps its relative precision.

Launch settings: `StatePassBwdSettings` and `IntraChunkBwdSettings` (`launch.LaunchSettings`; None: each one's
`defaults` for the shape).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import chunk_math as cm
from pallas_kernels.delta_rule_fwd import (DocumentMasks, StatePassSettings, check_block_v, chunk_decay, chunk_decays,
                                           chunk_shape, chunk_spec, columns, decays_spec, document_masks,
                                           document_spec, last_decays, masked, params, saved_state_dtype, seq_spec,
                                           split_documents, state_dot, state_spec, states_spec)
from pallas_kernels.launch import named_call, one_at_a_time, require


def _state_pass_bwd_kernel(q_decayed_ref, u_decayed_ref, decay_last_ref, Y_ref, Aqk_ref, do_ref, dht_ref, dr_ref,
                           dh0_ref, dstates_ref, *, chunk_size, num_chunks, sdot):
  f32 = jnp.float32
  C = chunk_size

  def chunk(i, d_state):
    n = num_chunks - 1 - i
    t = pl.ds(n * C, C)
    dstates_ref[n] = d_state.astype(dstates_ref.dtype)
    d_o = do_ref[t, :]
    d_r = sdot(Aqk_ref[t, :].T, d_o) + sdot(u_decayed_ref[t, :], d_state)
    dr_ref[t, :] = d_r.astype(dr_ref.dtype)
    return chunk_decay(decay_last_ref, n) * d_state + sdot(q_decayed_ref[t, :].T, d_o) - sdot(Y_ref[t, :].T, d_r)

  dh0_ref[...] = jax.lax.fori_loop(0, num_chunks, chunk, dht_ref[...].astype(f32))


@dataclasses.dataclass(frozen=True)
class StatePassBwdSettings(StatePassSettings):
  """Launch settings of `state_pass_bwd`: the forward pass's fields, rule and candidates (`StatePassSettings`, with
  d_o's dtype), measured on the two passes together."""


@functools.partial(jax.jit, static_argnames=("chunk_size", "settings", "interpret"))
def state_pass_bwd(chunks, d_o, d_final_state, *, chunk_size, settings=None, interpret=False):
  """Returns dR [B, T, H, V], d initial state [B, H, K, V] fp32 and the dS leaving every chunk [B, H, N, K, V],
  dR and dS in `saved_state_dtype` (bf16 for bf16 io; dS carried in fp32, rounded as it is stored). chunks: the
  `ChunkTensors` from `intra_chunk` (reads q_decayed, u_decayed, decay_last, Y and Aqk); d_o [B, T, H, V] in the io
  dtype, d_final_state [B, H, K, V] fp32. settings: `StatePassBwdSettings` (None: its rule for these shapes)."""
  c = chunks
  B, T, H, K = c.q_decayed.shape
  V = d_o.shape[-1]
  N = T // chunk_size
  shape = chunk_shape(c.q_decayed, d_o, chunk_size, d_o.dtype)
  s = StatePassBwdSettings.defaults(shape) if settings is None else settings
  check_block_v(s, V)
  block_v = s.block_v
  return pl.pallas_call(
      functools.partial(_state_pass_bwd_kernel, chunk_size=chunk_size, num_chunks=N,
                        sdot=state_dot(c.Y.dtype, interpret)),
      out_shape=(jax.ShapeDtypeStruct((B, T, H, V), saved_state_dtype(c.Y.dtype)),
                 jax.ShapeDtypeStruct((B, H, K, V), jnp.float32),
                 jax.ShapeDtypeStruct((B, H, N, K, V), saved_state_dtype(c.Y.dtype))),
      grid=(B, H, V // block_v),
      in_specs=[seq_spec(T, K)] * 2 + [decays_spec(c, N), seq_spec(T, K), seq_spec(T, chunk_size),
                                       seq_spec(T, V, block_v), state_spec(K, block_v)],
      out_specs=(seq_spec(T, V, block_v), state_spec(K, block_v), states_spec(N, K, block_v)),
      compiler_params=params(s.num_warps, s.num_stages),
      interpret=interpret,
      name="delta_rule_state_pass_bwd",
  )(c.q_decayed, c.u_decayed, c.decay_last, c.Y, c.Aqk, d_o, d_final_state)


def _intra_chunk_bwd_kernel(q_ref, u_ref, e_ref, z_ref, G_ref, r_ref, A_ref, s_ref, ds_ref, do_ref, dr_ref, *refs,
                            scale, key_block, value_block, scalar_decay, packed, interpret):
  """Passes 1 to 3 (pass 4 is `_pair_bwd_kernel`). packed: refs start with the chunk's documents, and every
  decay the forward masked (`DocumentMasks`) is masked here too, so the gradients, dg included, are those of
  the masked chunk form; pass 4 then needs no masks (dT and dAqk are 0 across documents). scalar_decay: G_ref and
  dg_ref [C], one decay per head: the terms of dg are summed over the channels, then over the rows they span."""
  documents_ref, (dz_ref, dg_ref, parts_ref, dt_ref, dAqk_ref) = split_documents(refs, packed)
  masks = document_masks(documents_ref) or DocumentMasks(None, None, None, None)
  f32 = jnp.float32
  near, io, _ = cm.precisions(z_ref.dtype, interpret)
  C, K = q_ref.shape
  V = z_ref.shape[-1]
  kb, vb = min(key_block, K), min(value_block, V)
  rows, cols = cm.iota((C, C), 0), cm.iota((C, C), 1)
  zeros = jnp.zeros((C, C), f32)

  # Pass 1, over V blocks: dz = A^T dR and dA = dR z^T (+ dY (e exp(G))^T in pass 2).
  A = A_ref[...]

  def v_block(j, d_a):
    d_r = columns(dr_ref, j, vb)
    dz_ref[:, pl.ds(j * vb, vb)] = cm.dot(A.T, d_r, io).astype(dz_ref.dtype)
    return d_a + cm.dot(d_r, columns(z_ref, j, vb).T, io)

  d_a = jax.lax.fori_loop(0, V // vb, v_block, zeros)

  # Pass 2, over key blocks: every product with the states, each state block read once (dY = -dR S^T,
  # dq~ = dO S^T, du~ = R dS^T, d exp(G_C)), and the terms of dq, du, de and dg they give, kept in the fp32
  # `parts` (0: d e, 1: d q~, 2: d u; dg's in dg itself) until pass 4 adds the pair terms. Only A and dA
  # stay live.
  def state_block(i, carry):
    d_a, *dg_terms = carry
    keys = pl.ds(i * kb, kb)
    d_y, d_q_decayed, d_u_decayed = (jnp.zeros((C, kb), f32) for _ in range(3))
    d_decay_last = jnp.zeros((kb,), f32)
    for j in range(V // vb):
      values = pl.ds(j * vb, vb)
      state, d_state = s_ref[keys, values], ds_ref[keys, values]
      d_y -= cm.dot(columns(dr_ref, j, vb), state.T, io)
      d_q_decayed += cm.dot(columns(do_ref, j, vb), state.T, io)
      d_u_decayed += cm.dot(columns(r_ref, j, vb), d_state.T, io)
      # Under bf16 io S and dS come stored in bf16 (`saved_state_dtype`), the rounding the dots above give them;
      # this product and its sum are fp32, so d exp(G_C) carries no rounding beyond theirs.
      d_decay_last += jnp.sum(state.astype(f32) * d_state.astype(f32), axis=1)
    G = chunk_decays(G_ref, keys, scalar_decay)
    exp_G = masked(masks.sees_state, jnp.exp(G))
    G_C = last_decays(G_ref, keys, scalar_decay)
    G_C = G_C if scalar_decay else G_C[None, :]
    exp_to_end = masked(masks.in_last, jnp.exp(G_C - G))
    e, u = columns(e_ref, i, kb), columns(u_ref, i, kb)
    e_decayed = e * exp_G
    d_e = exp_G * cm.dot(A.T, d_y, io)
    d_q_decayed *= exp_G
    parts_ref[0, :, keys] = d_e
    parts_ref[1, :, keys] = d_q_decayed
    parts_ref[2, :, keys] = exp_to_end * d_u_decayed
    # dg_t = sum_{r >= t} dG_r + sum_{r < t} (u exp(G_C - G) du~)_r + exp(G_C) d(exp(G_C)); pass 4 adds the
    # suffix sums of the pair terms' dG.
    d_G = e * d_e + columns(q_ref, i, kb) * scale * d_q_decayed
    if scalar_decay:  # summed over this block's channels here, over the rows they span after the loop
      row_terms, state_terms, last_terms = dg_terms
      dg_terms = (row_terms + jnp.sum(d_G, axis=1), state_terms + jnp.sum(u * exp_to_end * d_u_decayed, axis=1),
                  last_terms + d_decay_last)
    else:
      suffix, prefix = cm.lower_ones(C, False, i).T, cm.lower_ones(C, True, i)
      dg_ref[:, keys] = (cm.dot(suffix, d_G, near) + cm.dot(prefix, u * exp_to_end * d_u_decayed, near)
                         + masked(masks.carries, jnp.exp(G_C)) * d_decay_last[None, :])
    return d_a + cm.dot(d_y, e_decayed.T, io), *dg_terms

  if scalar_decay:
    by_row = jnp.zeros((C,), f32), jnp.zeros((C,), f32), jnp.zeros((kb,), f32)
    d_a, row_terms, state_terms, last_terms = jax.lax.fori_loop(0, K // kb, state_block, (d_a, *by_row))
    d_a = jnp.where(rows >= cols, d_a, 0.0)
    # g_t is in G_r for rows r >= t, in G_C - G_r for rows r < t, and in G_C: masked sums in fp32, no dot.
    dg_ref[...] = (jnp.sum(jnp.where(cols >= rows, row_terms[None, :], 0.0), axis=1)
                   + jnp.sum(jnp.where(cols < rows, state_terms[None, :], 0.0), axis=1)
                   + masked(masks.carries, jnp.exp(G_ref[C - 1])) * jnp.sum(last_terms))
  else:
    d_a = jnp.where(rows >= cols, jax.lax.fori_loop(0, K // kb, lambda i, d_a: state_block(i, (d_a,))[0], d_a), 0.0)
  d_t = masked(masks.same, jnp.where(rows > cols, -cm.dot(cm.dot(A.T, d_a, near), A.T, near), 0.0))

  # Pass 3, over V blocks: dAqk = dO R^T.
  d_Aqk = jax.lax.fori_loop(0, V // vb, lambda j, acc: acc + cm.dot(columns(do_ref, j, vb),
                                                                    columns(r_ref, j, vb).T, io), zeros)
  dt_ref[...] = d_t
  dAqk_ref[...] = masked(masks.same, d_Aqk)


def _pair_bwd_kernel(q_ref, u_ref, e_ref, G_ref, dt_ref, dAqk_ref, parts_ref, dg_in_ref, dq_ref, du_ref, de_ref,
                     dg_ref, *, scale, sub_block, bounded_block, interpret):
  """Pass 4, one key block of one chunk: the decayed Gram matrices' gradients (from dT and dAqk [C, C]),
  added to pass 2's terms (parts, dg) to give dq, du, de and dg. bounded_block: the forward's one or two dots
  per gram (`chunk_math.levels`)."""
  del dg_in_ref  # aliased with dg_ref
  near, io, _ = cm.precisions(dq_ref.dtype, interpret)
  C = dt_ref.shape[0]
  rows, cols = cm.iota((C, C), 0), cm.iota((C, C), 1)
  d_Aqk = dAqk_ref[...]
  d_Aqk_diag = jnp.sum(jnp.where(rows == cols, d_Aqk, 0.0), axis=1, keepdims=True)  # decay 1, no g
  d_Aqk_strict = jnp.where(rows > cols, d_Aqk, 0.0)
  G = G_ref[...]
  q, u, e = (x[...].astype(jnp.float32) for x in (q_ref, u_ref, e_ref))
  q = q * scale
  rows = (lambda at: u_ref[at, :].astype(jnp.float32), lambda at: G_ref[at, :])
  (d_e, d_q), d_u, d_G = cm.decayed_grams_bwd([(e, dt_ref[...]), (q, d_Aqk_strict)], u, G, io, rows, sub_block,
                                               bounded_block)
  dg_ref[...] += cm.dot(cm.lower_ones(C, False).T, d_G, near)
  dq_ref[...] = ((d_q + parts_ref[1] + d_Aqk_diag * u) * scale).astype(dq_ref.dtype)
  du_ref[...] = (d_u + parts_ref[2] + d_Aqk_diag * q).astype(du_ref.dtype)
  de_ref[...] = (d_e + parts_ref[0]).astype(de_ref.dtype)


def _scalar_pair_bwd_kernel(q_ref, u_ref, e_ref, G_ref, dt_ref, dAqk_ref, parts_ref, dg_in_ref, dq_ref, du_ref,
                            de_ref, dg_ref, *, scale, key_block, interpret):
  """Pass 4 with one decay per head (G_ref and dg_ref [C]), one chunk, key_block channels at a time. The grams are
  plain ones times D[r, c] = exp(G_r - G_c) (`delta_rule_fwd._scalar_grams`), so their gradients are plain dots with
  dT * D and dAqk * D, added to pass 2's terms (parts); each pair's term of dg, dT[r, c] T[r, c] (and Aqk's), goes
  to the g_t it spans, c < t <= r, as in `chunk_math.decayed_grams_bwd`."""
  del dg_in_ref  # aliased with dg_ref
  near, io, _ = cm.precisions(dq_ref.dtype, interpret)
  C, K = q_ref.shape
  kb = min(key_block, K)
  rows, cols = cm.iota((C, C), 0), cm.iota((C, C), 1)
  G = G_ref[...]
  causal = cols <= rows
  # Masked before exp, so every exponent is <= 0; dT is 0 on and above the diagonal, Aqk's diagonal has decay 1.
  D = jnp.exp(jnp.where(causal, G[:, None] - G[None, :], 0.0))
  p_t = dt_ref[...] * D
  p_qk = jnp.where(causal, dAqk_ref[...] * D, 0.0)

  def key_block_grads(i, pair_terms):
    keys = pl.ds(i * kb, kb)
    q = columns(q_ref, i, kb) * scale
    u, e = columns(u_ref, i, kb), columns(e_ref, i, kb)
    dq_ref[:, keys] = ((cm.dot(p_qk, u, io) + parts_ref[1, :, keys]) * scale).astype(dq_ref.dtype)
    du_ref[:, keys] = (cm.dot(p_t.T, e, io) + cm.dot(p_qk.T, q, io) + parts_ref[2, :, keys]).astype(du_ref.dtype)
    de_ref[:, keys] = (cm.dot(p_t, u, io) + parts_ref[0, :, keys]).astype(de_ref.dtype)
    u_t = u.T
    return pair_terms + p_t * cm.dot(e, u_t, io) + p_qk * cm.dot(q, u_t, io)

  # pair_terms[r, c] = dT[r, c] T[r, c] + dAqk[r, c] Aqk[r, c]; its diagonal spans no g and is never summed.
  pair_terms = jax.lax.fori_loop(0, K // kb, key_block_grads, jnp.zeros((C, C), jnp.float32))
  spans = cm.dot(cm.lower_ones(C, False).T, pair_terms, near)  # [t, c]: the pairs (r >= t, c)
  dg_ref[...] += jnp.sum(jnp.where(cols < rows, spans, 0.0), axis=1)


@dataclasses.dataclass(frozen=True)
class IntraChunkBwdSettings:
  """Launch settings of `intra_chunk_bwd`. Passes 1 to 3: key_block key and value_block value channels per step,
  num_warps warps, num_stages Triton pipelining stages of its channel-block loops. Pass 4 (pair_bwd): one key
  block of pair_key_block channels per program, pair_warps warps, the pairs inside blocks of sub_block rows
  formed elementwise (`chunk_math`); with one decay per head, one chunk per program, pair_key_block channels at a
  time. bounded_pairs: given a lower_bound, pass 4 differentiates the forward's one or two dots per gram (True) or
  the binary split's levels, the same function of g (False). A block wider than K or V takes all of it."""
  key_block: int
  value_block: int
  num_warps: int
  num_stages: int
  pair_key_block: int
  pair_warps: int
  sub_block: int
  bounded_pairs: bool

  @classmethod
  def defaults(cls, shape):
    """The settings chosen from the H200 sweeps at chunk 32 and 64 (they read shape.chunk_size alone); chunk 16
    takes chunk 32's, untimed."""
    # Warps, stages and sub-blocks from the H200 sweeps, key and value blocks at chunk <= 32 and bounded_pairs from
    # the H100's (at -5 and chunk 32 the bounded grams are two dots and a level, slower to differentiate than the
    # split); the one-decay pass 4 takes the per-channel one's key block and warps, untimed (benchmarks/ops/README.md,
    # launch settings).
    chunk_size, = require(shape, cls.__name__, "chunk_size")
    small = chunk_size <= 32
    return cls(key_block=16 if small else 32, value_block=64 if small else 32, num_warps=2 if small else 4,
               num_stages=2, pair_key_block=32, pair_warps=2 if small else 4, sub_block=4, bounded_pairs=False)

  @classmethod
  def candidates(cls, shape):
    return one_at_a_time(cls, shape, key_block=(16, 64), value_block=(16, 64), num_warps=(2, 4, 8),
                         num_stages=(1, 3), pair_key_block=(16, 64), pair_warps=(2, 4, 8), sub_block=(2, 8),
                         bounded_pairs=(True,))


SETTINGS = (StatePassBwdSettings, IntraChunkBwdSettings)


def parts_spec(C, K):
  """[3, B, T, H, K] fp32 (pass 2's terms of de, dq~, du), the three of one chunk per program of a (B, H, N) grid."""
  return pl.BlockSpec((3, pl.squeezed, C, pl.squeezed, K), lambda b, h, n: (0, b, n, h, 0))


@functools.partial(jax.jit, static_argnames=("scale", "chunk_size", "lower_bound", "settings", "interpret"))
def intra_chunk_bwd(q, u, e, z, G, r, A, states, d_states, d_o, d_r, *, scale, chunk_size, lower_bound=None,
                    documents=None, settings=None, interpret=False):
  """Returns (dq, du, de [B, T, H, K], dz [B, T, H, V] in the io dtype, dg [B, T, H, K] fp32).

  G: `chunk_cumsum(g)`, [B, T, H, K], or [B, T, H] with one decay per head (then dg is [B, T, H]); A: the inverse from
  `intra_chunk`; r = R [B, T, H, V] and d_r = dR [B, T, H, V]; states, d_states [B, H, N, K, V]: the state entering
  and the gradient of the state leaving each chunk; R, dR, states and d_states in the dtype `state_pass` and
  `state_pass_bwd` store them in (`saved_state_dtype`: bf16 under bf16 io); d_o [B, T, H, V]; documents: None, or the
  [B, T] int32 the forward's `intra_chunk` read (packed sequences); lower_bound: the one the forward's `intra_chunk`
  took (with settings.bounded_pairs pass 4 then differentiates its one or two dots per gram). dg is the gradient
  with respect to the g the forward's cumsum G summed; at a document start that g has no effect, and the op's
  masking of it gives it exactly 0.
  Two launches: passes 1 to 3 per chunk, then pass 4 per chunk and key block (per chunk with one decay per head).
  settings: `IntraChunkBwdSettings` (None: its defaults at chunk_size).
  """
  s = IntraChunkBwdSettings.defaults(chunk_shape(q, z, chunk_size, z.dtype)) if settings is None else settings
  B, T, H, K = q.shape
  V = z.shape[-1]
  C = chunk_size
  kb, pkb = min(s.key_block, K), min(s.pair_key_block, K)
  scalar_decay = G.ndim == 3
  bounded_block = cm.check_lower_bound(lower_bound, chunk_size, scalar_decay)  # the bound checked either way
  bounded_block = bounded_block if s.bounded_pairs else None
  decays = None if scalar_decay else K
  dg_shape = jax.ShapeDtypeStruct(G.shape, jnp.float32)
  sq = pl.squeezed
  chunk_state = pl.BlockSpec((sq, sq, sq, K, V), lambda b, h, n: (b, h, n, 0, 0))
  io = z.dtype
  pairs = jax.ShapeDtypeStruct((B, T, H, C), jnp.float32)
  packed = documents is not None
  extra = ((documents,), [document_spec(C)]) if packed else ((), [])
  dz, dg, parts, d_t, d_Aqk = pl.pallas_call(
      functools.partial(_intra_chunk_bwd_kernel, scale=scale, key_block=kb, value_block=s.value_block,
                        scalar_decay=scalar_decay, packed=packed, interpret=interpret),
      out_shape=(jax.ShapeDtypeStruct((B, T, H, V), io), dg_shape, jax.ShapeDtypeStruct((3, B, T, H, K), jnp.float32),
                 pairs, pairs),
      grid=(B, H, T // C),
      in_specs=[chunk_spec(C, K)] * 3 + [chunk_spec(C, V), chunk_spec(C, decays), chunk_spec(C, V), chunk_spec(C, C),
                                         chunk_state, chunk_state, chunk_spec(C, V), chunk_spec(C, V)] + extra[1],
      out_specs=(chunk_spec(C, V), chunk_spec(C, decays), parts_spec(C, K),
                 chunk_spec(C, C), chunk_spec(C, C)),
      compiler_params=params(s.num_warps, s.num_stages),
      interpret=interpret,
      name="delta_rule_intra_chunk_bwd",
  )(q, u, e, z, G, r, A, states, d_states, d_o, d_r, *extra[0])
  key_grad = jax.ShapeDtypeStruct((B, T, H, K), io)
  if scalar_decay:  # one chunk per program
    grid = (B, H, T // C)
    kernel = functools.partial(_scalar_pair_bwd_kernel, scale=scale, key_block=pkb, interpret=interpret)
    keys, g_spec, pair, terms = chunk_spec(C, K), chunk_spec(C), chunk_spec(C, C), parts_spec(C, K)
  else:  # one key block of one chunk per program
    grid = (B, H, T // C, K // pkb)
    kernel = functools.partial(_pair_bwd_kernel, scale=scale, sub_block=s.sub_block, bounded_block=bounded_block,
                               interpret=interpret)
    keys = g_spec = pl.BlockSpec((sq, C, sq, pkb), lambda b, h, n, i: (b, n, h, i))
    pair = pl.BlockSpec((sq, C, sq, C), lambda b, h, n, i: (b, n, h, 0))
    terms = pl.BlockSpec((3, sq, C, sq, pkb), lambda b, h, n, i: (0, b, n, h, i))
  dq, du, de, dg = named_call(
      kernel,
      dict(q=(q, keys), u=(u, keys), e=(e, keys), G=(G, g_spec), d_t=(d_t, pair), d_Aqk=(d_Aqk, pair),
           parts=(parts, terms), dg=(dg, g_spec)),
      dict(dq=(key_grad, keys), du=(key_grad, keys), de=(key_grad, keys), dg=(dg_shape, g_spec)),
      in_place=("dg",),  # pass 4 adds its terms of dg to pass 2's
      grid=grid, compiler_params=params(s.pair_warps), interpret=interpret, name="delta_rule_pair_bwd")
  return dq, du, de, dz, dg
