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


def _intra_chunk_kernel(q_ref, u_ref, e_ref, z_ref, g_ref, y_ref, w_ref, aqk_ref, *, n_sub, scale, interpret):
  f32 = jnp.float32
  near, exact = _precisions(interpret)
  K = q_ref.shape[-1]
  rows = lambda i: pl.ds(i * SUB, SUB)
  load = lambda ref, i: ref[rows(i), :].astype(f32)

  # Per sub-chunk: inclusive cumsum G_i and the reference point G_ref_i = cumsum before it.
  G, G_ref, carry = [], [], jnp.zeros((1, K), f32)
  for i in range(n_sub):
    g_i = load(g_ref, i)
    G_ref.append(carry)
    G.append(carry + jnp.cumsum(g_i, axis=0))
    carry = carry + jnp.sum(g_i, axis=0, keepdims=True)

  r_k = _iota((SUB, K), 0)
  r_s, c_s = _iota((SUB, SUB), 0), _iota((SUB, SUB), 1)
  T = {}
  A_qk = {}
  for i in range(n_sub):
    q_i, e_i = load(q_ref, i) * scale, load(e_ref, i)

    # Diagonal block: exact pairwise decay, one column at a time, masked before exp.
    def column(c, acc, i=i, q_i=q_i, e_i=e_i):
      t_acc, a_acc = acc
      u_c = u_ref[pl.ds(i * SUB + c, 1), :].astype(f32)
      G_c = jnp.sum(jnp.where(r_k == c, G[i], 0.0), axis=0, keepdims=True)
      causal = r_k >= c
      decay = jnp.where(causal, jnp.exp(jnp.where(causal, G[i] - G_c, 0.0)), 0.0) * u_c
      t_col = jnp.sum(jnp.where(r_k > c, e_i * decay, 0.0), axis=1, keepdims=True)
      a_col = jnp.sum(q_i * decay, axis=1, keepdims=True)
      return t_acc + jnp.where(c_s == c, t_col, 0.0), a_acc + jnp.where(c_s == c, a_col, 0.0)

    zeros = jnp.zeros((SUB, SUB), f32)
    T[i, i], A_qk[i, i] = jax.lax.fori_loop(0, SUB, column, (zeros, zeros))

    # Earlier sub-chunks: G[r] <= G_ref_i <= G[c], so both factors stay <= 1.
    e_left = e_i * jnp.exp(G[i] - G_ref[i])
    q_left = q_i * jnp.exp(G[i] - G_ref[i])
    for j in range(i):
      u_right = load(u_ref, j) * jnp.exp(G_ref[i] - G[j])
      T[i, j] = _dot(e_left, u_right.T, near)
      A_qk[i, j] = _dot(q_left, u_right.T, near)

  # Block forward substitution: A_ij = -A_ii sum_{j<=m<i} T_im A_mj.
  A = {}
  for i in range(n_sub):
    A[i, i] = _unit_lower_inverse(T[i, i], exact)
  for j in range(n_sub):
    for i in range(j + 1, n_sub):
      acc = _dot(T[i, j], A[j, j], near)
      for m in range(j + 1, i):
        acc += _dot(T[i, m], A[m, j], near)
      A[i, j] = -_dot(A[i, i], acc, near)

  e_decayed = [load(e_ref, j) * jnp.exp(G[j]) for j in range(n_sub)]
  z = [load(z_ref, j) for j in range(n_sub)]
  for i in range(n_sub):
    y_i = sum(_dot(A[i, j], e_decayed[j], near) for j in range(i + 1))
    w_i = sum(_dot(A[i, j], z[j], near) for j in range(i + 1))
    y_ref[rows(i), :] = y_i.astype(y_ref.dtype)
    w_ref[rows(i), :] = w_i.astype(w_ref.dtype)
    for j in range(n_sub):
      block = A_qk[i, j] if j <= i else jnp.zeros((SUB, SUB), f32)
      aqk_ref[rows(i), pl.ds(j * SUB, SUB)] = block.astype(aqk_ref.dtype)


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
