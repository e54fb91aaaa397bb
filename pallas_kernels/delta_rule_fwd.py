"""Pallas (Triton) forward kernels for the chunked generalized delta rule (SPEC.md section 2).

Two launches:
  intra_chunk  grid (B, H, N): per chunk, the decayed Gram matrices T and A_qk, the exact fp32
               inverse A = (I + T)^-1 on 16-row sub-chunks, and Y = A (e * exp(G)), U = A z.
  state_pass   grid (B, H, V / block_v): sequential over chunks, carries the fp32 state tile,
               R = U - Y S, o = (q * exp(G)) S + A_qk R, S <- exp(G_C) S + (u * exp(G_C - G))^T R.

Shapes (T padded to N * C, K and V powers of two >= 16): q, u, e: [B, T, H, K]; z: [B, T, H, V];
g: [B, T, H, K] fp32 log decay; initial_state: [B, H, K, V] fp32.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

SUB = 16
KEY_BLOCK = 16  # key channels per [16, 16, KEY_BLOCK] tile of the diagonal blocks
# Near-fp32 tensor-core products (three TF32 passes); plain TF32 gave ~6e-4 relative error in the inverse.
F32_DOT = jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3
EXACT_DOT = jax.lax.DotAlgorithmPreset.F32_F32_F32


def _dot(a, b, precision):
  return jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)


def _precisions(interpret):
  """(near-fp32, exact fp32) dot settings; the CPU interpreter only knows HIGHEST."""
  if interpret:
    return jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST
  return F32_DOT, EXACT_DOT


def _iota(shape, axis):
  return jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def _unit_lower_inverse(t, exact):
  """(I + t)^-1 for a strictly lower 16x16 t: prod_k (I + (-t)^(2^k)), exact fp32 products."""
  eye = (_iota(t.shape, 0) == _iota(t.shape, 1)).astype(jnp.float32)
  power = -t
  inverse = eye + power
  for _ in range(3):
    power = _dot(power, power, exact)
    inverse = _dot(inverse, eye + power, exact)
  return inverse


def _diagonal_blocks(q_ref, u_ref, e_ref, g_ref, i, scale):
  """(T_ii, A_qk_ii) of sub-chunk i: the exact pairwise decay exp(L_r - L_c), masked before exp.

  Formed as [16, 16, KB] tiles over blocks of KB key channels, so no per-column loop.
  """
  f32 = jnp.float32
  K = q_ref.shape[-1]
  kb = min(K, KEY_BLOCK)
  causal = (_iota((SUB, SUB, 1), 0) >= _iota((SUB, SUB, 1), 1))
  strict = _iota((SUB, SUB), 0) > _iota((SUB, SUB), 1)

  def key_block(b, acc):
    t_acc, a_acc = acc
    tile = lambda ref: ref[pl.ds(i * SUB, SUB), pl.ds(b * kb, kb)].astype(f32)
    local = jnp.cumsum(tile(g_ref), axis=0)  # sub-chunk-local cumsum: only differences are used
    expo = jnp.where(causal, local[:, None, :] - local[None, :, :], 0.0)
    decayed_u = jnp.where(causal, jnp.exp(expo), 0.0) * tile(u_ref)[None, :, :]  # [r, c, k]
    t_acc += jnp.where(strict, jnp.sum(tile(e_ref)[:, None, :] * decayed_u, axis=2), 0.0)
    a_acc += jnp.sum((tile(q_ref) * scale)[:, None, :] * decayed_u, axis=2)
    return t_acc, a_acc

  zeros = jnp.zeros((SUB, SUB), f32)
  return jax.lax.fori_loop(0, K // kb, key_block, (zeros, zeros))


def _intra_chunk_kernel(q_ref, u_ref, e_ref, z_ref, g_ref, y_ref, w_ref, aqk_ref, *, n_sub, scale, interpret):
  """Row block by row block, so only 16x16 blocks and a few [16, K] tiles are live at once."""
  f32 = jnp.float32
  near, exact = _precisions(interpret)
  K = q_ref.shape[-1]
  rows = lambda i: pl.ds(i * SUB, SUB)
  load = lambda ref, i: ref[rows(i), :].astype(f32)

  # G_ref[i]: the chunk cumsum before sub-chunk i; G_i = G_ref[i] + the local cumsum.
  G_ref = [jnp.zeros((1, K), f32)]
  for i in range(n_sub - 1):
    G_ref.append(G_ref[-1] + jnp.sum(load(g_ref, i), axis=0, keepdims=True))
  cumulative = lambda j: G_ref[j] + jnp.cumsum(load(g_ref, j), axis=0)

  A = {}
  for i in range(n_sub):
    G_i = cumulative(i)
    T = {}
    # Earlier sub-chunks: G_r <= G_ref[i] <= G_c, so both factors stay <= 1.
    row_decay = jnp.exp(G_i - G_ref[i])
    e_left, q_left = load(e_ref, i) * row_decay, load(q_ref, i) * (scale * row_decay)
    for j in range(i):
      u_right = load(u_ref, j) * jnp.exp(G_ref[i] - cumulative(j))
      T[j] = _dot(e_left, u_right.T, near)
      aqk_ref[rows(i), pl.ds(j * SUB, SUB)] = _dot(q_left, u_right.T, near).astype(aqk_ref.dtype)
    T[i], a_qk_ii = _diagonal_blocks(q_ref, u_ref, e_ref, g_ref, i, scale)
    aqk_ref[rows(i), pl.ds(i * SUB, SUB)] = a_qk_ii.astype(aqk_ref.dtype)
    for j in range(i + 1, n_sub):
      aqk_ref[rows(i), pl.ds(j * SUB, SUB)] = jnp.zeros((SUB, SUB), aqk_ref.dtype)

    # Block forward substitution: A_ij = -A_ii sum_{j<=m<i} T_im A_mj.
    A[i, i] = _unit_lower_inverse(T[i], exact)
    for j in range(i):
      acc = _dot(T[j], A[j, j], near)
      for m in range(j + 1, i):
        acc += _dot(T[m], A[m, j], near)
      A[i, j] = -_dot(A[i, i], acc, near)

    y_i = _dot(A[i, i], load(e_ref, i) * jnp.exp(G_i), near)
    w_i = _dot(A[i, i], load(z_ref, i), near)
    for j in range(i):
      y_i += _dot(A[i, j], load(e_ref, j) * jnp.exp(cumulative(j)), near)
      w_i += _dot(A[i, j], load(z_ref, j), near)
    y_ref[rows(i), :] = y_i.astype(y_ref.dtype)
    w_ref[rows(i), :] = w_i.astype(w_ref.dtype)


def _state_pass_kernel(q_ref, u_ref, g_ref, y_ref, w_ref, aqk_ref, h0_ref, o_ref, ht_ref, *, chunk_size,
                       num_chunks, scale, state_dot):
  f32 = jnp.float32
  C = chunk_size
  last_row = _iota((C, g_ref.shape[-1]), 0) == C - 1

  def chunk(n, state):
    t = pl.ds(n * C, C)
    g = g_ref[t, :].astype(f32)
    G = jnp.cumsum(g, axis=0)
    # The last row of the same cumsum (not a separate sum) keeps G_C - G consistently rounded.
    G_last = jnp.sum(jnp.where(last_row, G, 0.0), axis=0)
    q_decayed = q_ref[t, :].astype(f32) * (scale * jnp.exp(G))
    u_decayed = u_ref[t, :].astype(f32) * jnp.exp(G_last[None, :] - G)
    R = w_ref[t, :].astype(f32) - state_dot(y_ref[t, :], state)
    o = state_dot(q_decayed, state) + state_dot(aqk_ref[t, :], R)
    o_ref[t, :] = o.astype(o_ref.dtype)
    return jnp.exp(G_last)[:, None] * state + state_dot(u_decayed.T, R)

  ht_ref[...] = jax.lax.fori_loop(0, num_chunks, chunk, h0_ref[...].astype(f32))


def _params(num_warps, num_stages):
  return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


@functools.partial(jax.jit, static_argnames=("scale", "chunk_size", "interpret"))
def intra_chunk(q, u, e, z, g, *, scale, chunk_size, interpret=False):
  """Per chunk: Y = A (e * exp(G)) [B, T, H, K], U = A z [B, T, H, V], A_qk [B, T, H, C] (in z.dtype)."""
  B, T, H, K = q.shape
  V = z.shape[-1]
  C = chunk_size
  sq = pl.squeezed
  chunk_spec = lambda d: pl.BlockSpec((sq, C, sq, d), lambda b, h, n: (b, n, h, 0))
  return pl.pallas_call(
      functools.partial(_intra_chunk_kernel, n_sub=C // SUB, scale=scale, interpret=interpret),
      out_shape=(jax.ShapeDtypeStruct((B, T, H, K), z.dtype), jax.ShapeDtypeStruct((B, T, H, V), z.dtype),
                 jax.ShapeDtypeStruct((B, T, H, C), z.dtype)),
      grid=(B, H, T // C),
      in_specs=[chunk_spec(K)] * 3 + [chunk_spec(V), chunk_spec(K)],
      out_specs=(chunk_spec(K), chunk_spec(V), chunk_spec(C)),
      compiler_params=_params(4, 1),
      interpret=interpret,
      name="delta_rule_intra_chunk",
  )(q, u, e, z, g)


@functools.partial(jax.jit, static_argnames=("scale", "chunk_size", "block_v", "num_stages", "interpret"))
def state_pass(q, u, g, y, w, aqk, initial_state, *, scale, chunk_size, block_v=32, num_stages=1,
               interpret=False):
  """Sequential over chunks: o [B, T, H, V] in w.dtype and the final state [B, H, K, V] fp32."""
  B, T, H, K = q.shape
  V = w.shape[-1]
  block_v = min(block_v, V)
  io_dtype = w.dtype
  sq = pl.squeezed
  # fp32 inputs keep near-fp32 products; bf16 inputs multiply in bf16 with fp32 accumulation.
  if io_dtype == jnp.float32:
    state_dot = functools.partial(_dot, precision=_precisions(interpret)[0])
  else:
    state_dot = lambda a, b: _dot(a.astype(io_dtype), b.astype(io_dtype), None)
  seq_spec = lambda d: pl.BlockSpec((sq, T, sq, d), lambda b, h, j: (b, 0, h, 0))
  seq_tile = pl.BlockSpec((sq, T, sq, block_v), lambda b, h, j: (b, 0, h, j))
  state_tile = pl.BlockSpec((sq, sq, K, block_v), lambda b, h, j: (b, h, 0, j))
  return pl.pallas_call(
      functools.partial(_state_pass_kernel, chunk_size=chunk_size, num_chunks=T // chunk_size, scale=scale,
                        state_dot=state_dot),
      out_shape=(jax.ShapeDtypeStruct((B, T, H, V), io_dtype), jax.ShapeDtypeStruct((B, H, K, V), jnp.float32)),
      grid=(B, H, V // block_v),
      in_specs=[seq_spec(K), seq_spec(K), seq_spec(K), seq_spec(K), seq_tile, seq_spec(chunk_size), state_tile],
      out_specs=(seq_tile, state_tile),
      compiler_params=_params(4, num_stages),
      interpret=interpret,
      name="delta_rule_state_pass",
  )(q, u, g, y, w, aqk, initial_state)


def delta_rule_fwd(q, u, e, z, g, initial_state, *, scale, chunk_size=64, block_v=32, num_stages=1,
                   interpret=False):
  """Returns (o [B, T, H, V] in z.dtype, final state [B, H, K, V] fp32).

  q, u, e: [B, T, H, K]; z: [B, T, H, V]; g: [B, T, H, K] fp32; initial_state: [B, H, K, V] fp32.
  T a multiple of chunk_size; K and V powers of two >= 16; chunk_size in {16, 32, 64, 128}.
  """
  y, w, aqk = intra_chunk(q, u, e, z, g, scale=scale, chunk_size=chunk_size, interpret=interpret)
  return state_pass(q, u, g, y, w, aqk, initial_state, scale=scale, chunk_size=chunk_size, block_v=block_v,
                    num_stages=num_stages, interpret=interpret)
