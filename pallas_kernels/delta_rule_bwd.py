"""Pallas (Triton) backward kernels for the chunked generalized delta rule (SPEC.md section 2).

Two launches, the forward's in reverse:
  state_pass_bwd  grid (B, H, V / block_v): sequential over chunks from the last, carries dS (the
                  gradient of the state leaving a chunk) and writes dR = A_qk^T dO + W dS and every
                  chunk's dS; dS <- exp(G_C) dS + q~^T dO - Y^T dR (the forward's q~, u~, exp(G_C)).
  intra_chunk_bwd grid (B, H, N): per chunk, with R and the state S entering it (saved by the forward)
                  and dS: the products that contract V (dQ~ = dO S^T, dW = R dS^T, dY = -dR S^T,
                  dA_qk, dA, dz = A^T dR), then the WY inverse (dT = -A^T dA A^T, the channel gates
                  inside dA), the decayed Gram matrices and the decays, down to dq, du, de, dz and dg.
                  Key channels go in blocks (`default_key_block`) so the [C, K] work stays in registers.

d/dg: every term is attributed to exactly the log decays it spans (pair terms through
`chunk_math.decayed_grams_bwd`, then one reverse cumsum, and the terms of u * exp(G_C - G) through
an exclusive cumsum), both as 0/1 dots, never as a difference of two large sums, so a gradient as
small as exp(-30) keeps its relative precision.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import chunk_math as cm
from pallas_kernels.delta_rule_fwd import (VALUE_BLOCK, chunk_rows_spec, chunk_spec, columns, default_key_block, params,
                                           seq_spec, state_dot, state_spec, states_spec)


def _state_pass_bwd_kernel(qd_ref, ud_ref, decay_ref, y_ref, aqk_ref, do_ref, dht_ref, dr_ref, dh0_ref, dstates_ref, *,
                           chunk_size, num_chunks, sdot):
  f32 = jnp.float32
  C = chunk_size

  def chunk(i, d_state):
    n = num_chunks - 1 - i
    t = pl.ds(n * C, C)
    dstates_ref[n] = d_state
    d_o = do_ref[t, :]
    d_r = sdot(aqk_ref[t, :].T, d_o) + sdot(ud_ref[t, :], d_state)
    dr_ref[t, :] = d_r
    return decay_ref[n][:, None] * d_state + sdot(qd_ref[t, :].T, d_o) - sdot(y_ref[t, :].T, d_r)

  dh0_ref[...] = jax.lax.fori_loop(0, num_chunks, chunk, dht_ref[...].astype(f32))


@functools.partial(jax.jit, static_argnames=("chunk_size", "block_v", "num_warps", "interpret"))
def state_pass_bwd(qd, ud, decay, y, aqk, d_o, d_final_state, *, chunk_size, block_v=32, num_warps=4,
                   interpret=False):
  """Returns dR [B, T, H, V] fp32, d initial state [B, H, K, V] fp32 and the dS leaving every chunk
  [B, H, N, K, V] fp32. qd, ud, decay: q~, u~, exp(G_C) from `intra_chunk`; d_o [B, T, H, V] in the io
  dtype, d_final_state [B, H, K, V] fp32."""
  B, T, H, K = qd.shape
  V = d_o.shape[-1]
  N = T // chunk_size
  block_v = min(block_v, V)
  return pl.pallas_call(
      functools.partial(_state_pass_bwd_kernel, chunk_size=chunk_size, num_chunks=N,
                        sdot=state_dot(y.dtype, interpret)),
      out_shape=(jax.ShapeDtypeStruct((B, T, H, V), jnp.float32), jax.ShapeDtypeStruct((B, H, K, V), jnp.float32),
                 jax.ShapeDtypeStruct((B, H, N, K, V), jnp.float32)),
      grid=(B, H, V // block_v),
      in_specs=[seq_spec(T, K)] * 2 + [chunk_rows_spec(N, K), seq_spec(T, K), seq_spec(T, chunk_size),
                                       seq_spec(T, V, block_v), state_spec(K, block_v)],
      out_specs=(seq_spec(T, V, block_v), state_spec(K, block_v), states_spec(N, K, block_v)),
      compiler_params=params(num_warps),
      interpret=interpret,
      name="delta_rule_state_pass_bwd",
  )(qd, ud, decay, y, aqk, d_o, d_final_state)


def _intra_chunk_bwd_kernel(q_ref, u_ref, e_ref, z_ref, g_ref, r_ref, a_ref, s_ref, ds_ref, do_ref, dr_ref,
                            dz_ref, dg_ref, parts_ref, *out_refs, scale, key_block, sub_block, split, interpret):
  """Passes 1 to 3, then pass 4 over every key block into out_refs (dq, du, de); with split, out_refs are
  (dT, dA_qk) and pass 4 is left to `_pair_bwd_kernel`."""
  f32 = jnp.float32
  near, io, _ = cm.precisions(z_ref.dtype, interpret)
  C, K = q_ref.shape
  V = z_ref.shape[-1]
  kb, vb = min(key_block, K), min(VALUE_BLOCK, V)
  rows, cols = cm.iota((C, C), 0), cm.iota((C, C), 1)
  zeros = jnp.zeros((C, C), f32)

  # Pass 1, over V blocks: dz = A^T dR and dA = dR z^T (+ dY (e exp(G))^T in pass 2).
  A = a_ref[...]

  def v_block(j, d_a):
    d_r = columns(dr_ref, j, vb)
    dz_ref[:, pl.ds(j * vb, vb)] = cm.dot(A.T, d_r, io).astype(dz_ref.dtype)
    return d_a + cm.dot(d_r, columns(z_ref, j, vb).T, io)

  d_a = jax.lax.fori_loop(0, V // vb, v_block, zeros)

  # Pass 2, over key blocks: every product with the states, each state block read once (dY = -dR S^T,
  # dQ~ = dO S^T, dW = R dS^T, d exp(G_C)), and the terms of dq, du, de and dg they give, kept in the fp32
  # `parts` (0: d e, 1: d q~, 2: d u; dg's in dg itself) until pass 4 adds the pair terms. Only A and dA
  # stay live.
  def state_block(i, d_a):
    keys = pl.ds(i * kb, kb)
    d_y, d_qd, d_w = (jnp.zeros((C, kb), f32) for _ in range(3))
    d_decay = jnp.zeros((kb,), f32)
    for j in range(V // vb):
      values = pl.ds(j * vb, vb)
      state, d_state = s_ref[keys, values], ds_ref[keys, values]
      d_y -= cm.dot(columns(dr_ref, j, vb), state.T, io)
      d_qd += cm.dot(columns(do_ref, j, vb), state.T, io)
      d_w += cm.dot(columns(r_ref, j, vb), d_state.T, io)
      d_decay += jnp.sum(state * d_state, axis=1)
    G = jnp.cumsum(columns(g_ref, i, kb), axis=0)
    decay = jnp.exp(G)
    G_last = cm.last_row(G)[None, :]
    to_end = jnp.exp(G_last - G)
    e, u = columns(e_ref, i, kb), columns(u_ref, i, kb)
    e_decayed = e * decay
    d_e = decay * cm.dot(A.T, d_y, io)
    d_qd *= decay
    parts_ref[0, :, keys] = d_e
    parts_ref[1, :, keys] = d_qd
    parts_ref[2, :, keys] = to_end * d_w
    # dg_t = sum_{r >= t} dG_r + sum_{r < t} (u exp(G_C - G) dW)_r + exp(G_C) d(exp(G_C)); pass 4 adds the
    # suffix sums of the pair terms' dG.
    d_G = e * d_e + columns(q_ref, i, kb) * scale * d_qd
    suffix, prefix = cm.lower_ones(C, False, i).T, cm.lower_ones(C, True, i)
    dg_ref[:, keys] = (cm.dot(suffix, d_G, near) + cm.dot(prefix, u * to_end * d_w, near)
                       + jnp.exp(G_last) * d_decay[None, :])
    return d_a + cm.dot(d_y, e_decayed.T, io)

  d_a = jnp.where(rows >= cols, jax.lax.fori_loop(0, K // kb, state_block, d_a), 0.0)
  d_t = jnp.where(rows > cols, -cm.dot(cm.dot(A.T, d_a, near), A.T, near), 0.0)

  # Pass 3, over V blocks: dA_qk = dO R^T.
  d_aqk = jax.lax.fori_loop(0, V // vb, lambda j, acc: acc + cm.dot(columns(do_ref, j, vb),
                                                                    columns(r_ref, j, vb).T, io), zeros)
  if split:
    out_refs[0][...] = d_t
    out_refs[1][...] = d_aqk
    return
  cm.barrier(interpret)()

  def pair_block(i, carry):
    pair_pass(i, i, d_t, d_aqk, q_ref, u_ref, e_ref, g_ref, parts_ref, *out_refs, dg_ref, scale=scale, key_block=kb,
              sub_block=sub_block, io=io, near=near)
    return carry

  jax.lax.fori_loop(0, K // kb, pair_block, 0)


def pair_pass(i, loop_index, d_t, d_aqk, q_ref, u_ref, e_ref, g_ref, parts_ref, dq_ref, du_ref, de_ref, dg_ref, *,
              scale, key_block, sub_block, io, near):
  """Pass 4 for key block i of the refs: the decayed Gram matrices' gradients (dT, dA_qk [C, C]), added to
  pass 2's terms (parts, dg) to give dq, du, de and dg. loop_index: see `chunk_math.decayed_grams_bwd`."""
  C = d_t.shape[0]
  keys = pl.ds(i * key_block, key_block)
  rows, cols = cm.iota((C, C), 0), cm.iota((C, C), 1)
  d_aqk_diag = jnp.sum(jnp.where(rows == cols, d_aqk, 0.0), axis=1, keepdims=True)  # decay 1, no g
  d_aqk_strict = jnp.where(rows > cols, d_aqk, 0.0)
  G = jnp.cumsum(columns(g_ref, i, key_block), axis=0)
  q, u, e = (columns(x, i, key_block) for x in (q_ref, u_ref, e_ref))
  q = q * scale
  (d_e, d_q), d_u, d_G = cm.decayed_grams_bwd([(e, d_t), (q, d_aqk_strict)], u, G, io, loop_index, sub_block)
  dg_ref[:, keys] += cm.dot(cm.lower_ones(C, False, loop_index).T, d_G, near)
  dq_ref[:, keys] = ((d_q + parts_ref[1, :, keys] + d_aqk_diag * u) * scale).astype(dq_ref.dtype)
  du_ref[:, keys] = (d_u + parts_ref[2, :, keys] + d_aqk_diag * q).astype(du_ref.dtype)
  de_ref[:, keys] = (d_e + parts_ref[0, :, keys]).astype(de_ref.dtype)


def _pair_bwd_kernel(q_ref, u_ref, e_ref, g_ref, dt_ref, daqk_ref, parts_ref, dg_in_ref, dq_ref, du_ref, de_ref,
                     dg_ref, *, scale, sub_block, interpret):
  del dg_in_ref  # aliased with dg_ref
  near, io, _ = cm.precisions(dq_ref.dtype, interpret)
  pair_pass(0, pl.program_id(3), dt_ref[...], daqk_ref[...], q_ref, u_ref, e_ref, g_ref, parts_ref, dq_ref, du_ref,
            de_ref, dg_ref, scale=scale, key_block=q_ref.shape[-1], sub_block=sub_block, io=io, near=near)


@functools.partial(jax.jit, static_argnames=("scale", "chunk_size", "key_block", "sub_block", "num_warps", "split",
                                             "interpret"))
def intra_chunk_bwd(q, u, e, z, g, r, A, states, d_states, d_o, d_r, *, scale, chunk_size, key_block=None,
                    sub_block=cm.SUB_BLOCK, num_warps=4, split=False, interpret=False):
  """Returns (dq, du, de [B, T, H, K], dz [B, T, H, V] in the io dtype, dg [B, T, H, K] fp32).

  A: the inverse from `intra_chunk`; r (= R), states, d_states [B, H, N, K, V]: R, the state entering and the
  gradient of the state leaving each chunk; d_o [B, T, H, V]; d_r [B, T, H, V] fp32 from `state_pass_bwd`.
  split: pass 4 in a second launch, one program per chunk and key block.
  """
  B, T, H, K = q.shape
  V = z.shape[-1]
  C = chunk_size
  kb = min(key_block or default_key_block(C, True), K)
  sq = pl.squeezed
  chunk_state = pl.BlockSpec((sq, sq, sq, K, V), lambda b, h, n: (b, h, n, 0, 0))
  parts_spec = pl.BlockSpec((3, sq, C, sq, K), lambda b, h, n: (0, b, n, h, 0))
  io = z.dtype
  key = jax.ShapeDtypeStruct((B, T, H, K), io)
  pairs = jax.ShapeDtypeStruct((B, T, H, C), jnp.float32)
  # dz, dg, parts (pass 2's terms), then dq, du, de or, split, dT and dA_qk
  out_shape = [jax.ShapeDtypeStruct((B, T, H, V), io), jax.ShapeDtypeStruct((B, T, H, K), jnp.float32),
               jax.ShapeDtypeStruct((3, B, T, H, K), jnp.float32)] + ([pairs] * 2 if split else [key] * 3)
  out_specs = [chunk_spec(C, V), chunk_spec(C, K), parts_spec] + [chunk_spec(C, C) if split else chunk_spec(C, K)] * (
      2 if split else 3)
  outs = pl.pallas_call(
      functools.partial(_intra_chunk_bwd_kernel, scale=scale, key_block=kb, sub_block=sub_block, split=split,
                        interpret=interpret),
      out_shape=tuple(out_shape),
      grid=(B, H, T // C),
      in_specs=[chunk_spec(C, K)] * 3 + [chunk_spec(C, V), chunk_spec(C, K), chunk_spec(C, V), chunk_spec(C, C),
                                         chunk_state, chunk_state, chunk_spec(C, V), chunk_spec(C, V)],
      out_specs=tuple(out_specs),
      compiler_params=params(num_warps),
      interpret=interpret,
      name="delta_rule_intra_chunk_bwd",
  )(q, u, e, z, g, r, A, states, d_states, d_o, d_r)
  if not split:
    dz, dg, _, dq, du, de = outs
    return dq, du, de, dz, dg
  dz, dg, parts, d_t, d_aqk = outs
  block = pl.BlockSpec((sq, C, sq, kb), lambda b, h, n, i: (b, n, h, i))
  pair = pl.BlockSpec((sq, C, sq, C), lambda b, h, n, i: (b, n, h, 0))
  part = pl.BlockSpec((3, sq, C, sq, kb), lambda b, h, n, i: (0, b, n, h, i))
  dq, du, de, dg = pl.pallas_call(
      functools.partial(_pair_bwd_kernel, scale=scale, sub_block=sub_block, interpret=interpret),
      out_shape=(key,) * 3 + (jax.ShapeDtypeStruct((B, T, H, K), jnp.float32),),
      grid=(B, H, T // C, K // kb),
      in_specs=[block] * 4 + [pair] * 2 + [part, block],
      out_specs=(block,) * 4,
      input_output_aliases={7: 3},
      compiler_params=params(num_warps),
      interpret=interpret,
      name="delta_rule_pair_bwd",
  )(q, u, e, g, d_t, d_aqk, parts, dg)
  return dq, du, de, dz, dg
