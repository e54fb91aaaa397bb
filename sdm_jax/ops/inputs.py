"""The reference forming of a mixer's inputs to the generalized rule (DESIGN.md section 1), by XLA on whole arrays:
what the scan and chunk impls run, what impl="pallas" falls back to where its kernel does not take the head dims,
and what its backward differentiates (the kernels of pallas_kernels/mixer_inputs.py compute the same per block).
"""

import jax
import jax.numpy as jnp

from pallas_kernels.mixer_inputs import EPS  # one epsilon for the reference and the kernels that normalise in-block


def l2norm(x, eps=EPS):
  """x / ||x|| over the last axis, computed in fp32 (or float64)."""
  x = x.astype(jnp.promote_types(jnp.float32, x.dtype))
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def accumulation_dtype(io_dtype, *arrays):
  """fp32, or wider where an input or io_dtype is."""
  return jnp.result_type(jnp.float32, io_dtype, *[x.dtype for x in arrays])


def reference_inputs(build, use_qk_l2norm, io_dtype, q, k, v, *gates):
  """(q, u, e, z) in io_dtype: l2norm of q and k (when asked) and build(k, v, *gates), in the accumulation dtype.

  q, k [B, T, H, K]; v [B, T, H, V]; gates (all but the log decay g) [B, T, H], [B, T, H, K] or [B, T, H, V].
  """
  acc = accumulation_dtype(io_dtype, q, k, v, *gates)
  if use_qk_l2norm:
    q, k = l2norm(q), l2norm(k)
  q, k, v = (x.astype(acc) for x in (q, k, v))
  u, e, z = build(k, v, *[x.astype(acc) for x in gates])
  return tuple(x.astype(io_dtype) for x in (q, u, e, z))
