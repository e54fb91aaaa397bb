"""impl="pallas": the generalized rule on the Pallas kernels (interpret mode off the GPU).

The forward runs `pallas_kernels.delta_rule_fwd`. The backward is, for now, reverse-mode autodiff
of the pure-JAX chunked form on the saved inputs (recomputed, fp32); Pallas backward kernels
replace it in the kernels issue.
"""

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.delta_rule_fwd import delta_rule_fwd
from sdm_jax.ops.chunk import delta_rule_chunk

PALLAS_CHUNK_SIZES = (16, 32, 64, 128)


def _next_pow2(n, floor=16):
  return max(floor, 1 << (n - 1).bit_length())


def _padded_fwd(q, u, e, z, g, state, scale, chunk_size):
  B, T, H, K = q.shape
  V = z.shape[-1]
  Tp, Kp, Vp = -(-T // chunk_size) * chunk_size, _next_pow2(K), _next_pow2(V)
  pad = lambda x, d: jnp.pad(x, ((0, 0), (0, Tp - T), (0, 0), (0, d - x.shape[-1])))
  # Padded tokens have g = 0 and zero keys, padded channels zero keys and values: they change nothing.
  o, final_state = delta_rule_fwd(
      pad(q, Kp), pad(u, Kp), pad(e, Kp), pad(z, Vp), pad(g, Kp),
      jnp.pad(state, ((0, 0), (0, 0), (0, Kp - K), (0, Vp - V))),
      scale=scale, chunk_size=chunk_size, interpret=jax.default_backend() != "gpu")
  return o[:, :T, :, :V], final_state[:, :, :K, :V]


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _delta_rule_pallas(q, u, e, z, g, state, scale, chunk_size):
  return _padded_fwd(q, u, e, z, g, state, scale, chunk_size)


def _fwd(q, u, e, z, g, state, scale, chunk_size):
  return _padded_fwd(q, u, e, z, g, state, scale, chunk_size), (q, u, e, z, g, state)


def _bwd(scale, chunk_size, residuals, cotangents):
  f32 = [x.astype(jnp.float32) for x in residuals]
  _, vjp = jax.vjp(lambda *xs: delta_rule_chunk(*xs[:5], scale, xs[5], chunk_size), *f32)
  d_o, d_state = cotangents
  grads = vjp((d_o.astype(jnp.float32), d_state.astype(jnp.float32)))
  return tuple(gr.astype(x.dtype) for gr, x in zip(grads, residuals))


_delta_rule_pallas.defvjp(_fwd, _bwd)


def delta_rule_pallas(q, u, e, z, g, scale, initial_state, chunk_size, io_dtype):
  """Same contract as `delta_rule_chunk`; q, u, e, z travel in `io_dtype`, g and the state in fp32."""
  if chunk_size not in PALLAS_CHUNK_SIZES:
    raise ValueError(f"chunk_size: impl='pallas' supports {PALLAS_CHUNK_SIZES}, got {chunk_size}")
  q, u, e, z = (x.astype(io_dtype) for x in (q, u, e, z))
  o, final_state = _delta_rule_pallas(q, u, e, z, g.astype(jnp.float32), initial_state.astype(jnp.float32),
                                      scale, chunk_size)
  return o, final_state
