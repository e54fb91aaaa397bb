"""impl="pallas": the generalized rule on the Pallas kernels (interpret mode off the GPU).

Forward: `pallas_kernels.delta_rule_fwd` (chunk_cumsum, intra_chunk, then state_pass). Backward, in a
custom_vjp: `pallas_kernels.delta_rule_bwd` (state_pass_bwd, then intra_chunk_bwd) on residuals the forward
saved: the padded inputs (g as its chunk cumsum G, which every kernel reads), Y, A_qk, the chunk decays
q~, u~, exp(G_C), the fp32 inverse A, the fp32 state entering every chunk and R = U - Y S.
"""

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.delta_rule_bwd import intra_chunk_bwd, state_pass_bwd
from pallas_kernels.delta_rule_fwd import chunk_cumsum, intra_chunk, state_pass

# Chunk 128 is not offered: on the H200 its backward kernel asks for more shared memory than a program may have
# (262,144 of 232,448 bytes) and its forward per-chunk kernels took 7.2 ms at B 4, T 4096, H 16 against 0.85 at
# chunk 32 (2026-11-30, benchmarks/2026-11-30_h200_session8.md).
PALLAS_CHUNK_SIZES = (16, 32, 64)


def next_pow2(n, floor=16):
  return max(floor, 1 << (n - 1).bit_length())


def _padding(T, K, V, chunk_size):
  """Padded (T, K, V): T to whole chunks, K and V to powers of two >= 16. Padded tokens have g = 0
  and zero keys, padded channels zero keys and values: they change nothing."""
  return -(-T // chunk_size) * chunk_size, next_pow2(K), next_pow2(V)


def _pad(x, T, d):
  return jnp.pad(x, ((0, 0), (0, T - x.shape[1]), (0, 0), (0, d - x.shape[-1])))


def _pad_state(s, K, V):
  return jnp.pad(s, ((0, 0), (0, 0), (0, K - s.shape[2]), (0, V - s.shape[3])))


def interpret():
  return jax.default_backend() != "gpu"


def _forward(q, u, e, z, g, state, scale, chunk_size, save):
  B, T, H, K = q.shape
  V = z.shape[-1]
  Tp, Kp, Vp = _padding(T, K, V, chunk_size)
  q, u, e, g = (_pad(x, Tp, Kp) for x in (q, u, e, g))
  z = _pad(z, Tp, Vp)
  kw = dict(chunk_size=chunk_size, interpret=interpret())
  G = chunk_cumsum(g, **kw)
  y, w, aqk, qd, ud, decay, *inverse = intra_chunk(q, u, e, z, G, save_inverse=save, scale=scale, **kw)
  o, final_state, *saved = state_pass(qd, ud, decay, y, w, aqk, _pad_state(state, Kp, Vp), save_states=save, **kw)
  out = (o[:, :T, :, :V], final_state[:, :, :K, :V])
  return out, ((q, u, e, z, G, y, aqk, qd, ud, decay, inverse[0], *saved) if save else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _delta_rule_pallas(q, u, e, z, g, state, scale, chunk_size):
  return _forward(q, u, e, z, g, state, scale, chunk_size, save=False)[0]


def _fwd(q, u, e, z, g, state, scale, chunk_size):
  out, saved = _forward(q, u, e, z, g, state, scale, chunk_size, save=True)
  return out, (saved, q.shape, z.shape[-1])


def _bwd(scale, chunk_size, residuals, cotangents):
  (q, u, e, z, G, y, aqk, qd, ud, decay, inverse, states, r), (B, T, H, K), V = residuals
  d_o, d_final = cotangents
  Tp, Kp, Vp = q.shape[1], q.shape[-1], z.shape[-1]
  kw = dict(chunk_size=chunk_size, interpret=interpret())
  d_o = _pad(d_o.astype(z.dtype), Tp, Vp)
  d_r, d_state, d_states = state_pass_bwd(qd, ud, decay, y, aqk, d_o,
                                          _pad_state(d_final.astype(jnp.float32), Kp, Vp), **kw)
  dq, du, de, dz, dg = intra_chunk_bwd(q, u, e, z, G, r, inverse, states, d_states, d_o, d_r, scale=scale, **kw)
  key = lambda x: x[:, :T, :, :K]
  return key(dq), key(du), key(de), dz[:, :T, :, :V], key(dg), d_state[:, :, :K, :V]


_delta_rule_pallas.defvjp(_fwd, _bwd)


def delta_rule_pallas(q, u, e, z, g, scale, initial_state, chunk_size, io_dtype):
  """Same contract as `delta_rule_chunk`; q, u, e, z travel in `io_dtype`, g and the state in fp32."""
  if chunk_size not in PALLAS_CHUNK_SIZES:
    raise ValueError(f"chunk_size: impl='pallas' supports {PALLAS_CHUNK_SIZES} (at 128 its backward needs more "
                     f"shared memory than a GPU program has; impl='chunk' takes any power of two), got {chunk_size}")
  q, u, e, z = (x.astype(io_dtype) for x in (q, u, e, z))
  return _delta_rule_pallas(q, u, e, z, g.astype(jnp.float32), initial_state.astype(jnp.float32), scale,
                            chunk_size)
