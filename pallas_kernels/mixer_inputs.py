"""One Pallas launch that forms a mixer's inputs to the generalized rule (SPEC.md section 1) for impl="pallas".

A mixer gives q, k, v, its log decay g, its other gates and `build(k, v, *gates) -> (u, e, z)`. Done by XLA,
the l2norm of q and k, build and the casts to the io dtype were three or four fusions that read k twice
(0.162 ms of the 4x4096 GDN-2 forward on the H200, 2026-11-30, benchmarks/2026-11-30_h200_session9.md). Here
one program per (batch, head, block of rows) reads each input once and writes q, u, e, z in the io dtype.

The backward is XLA's: autodiff of `reference_inputs`, the same arithmetic on whole arrays (which is also how
the other impls form their inputs). g is not read here; it goes to the rule as it is.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

ROWS, WARPS = 32, 4  # tokens per program and its warps (untimed alternatives: benchmarks/scripts/probe_prep.py)
EPS = 1e-6


def l2norm(x, eps=EPS):
  """x / ||x|| over the last axis, computed in fp32 (or float64)."""
  x = x.astype(jnp.promote_types(jnp.float32, x.dtype))
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def accumulation_dtype(io_dtype, *arrays):
  """fp32, or wider where an input or io_dtype is."""
  return jnp.result_type(jnp.float32, io_dtype, *[x.dtype for x in arrays])


def reference_inputs(build, use_qk_l2norm, io_dtype, q, k, v, *gates):
  """(q, u, e, z) in io_dtype, by XLA: l2norm of q and k (when asked) and build, in the accumulation dtype."""
  acc = accumulation_dtype(io_dtype, q, k, v, *gates)
  if use_qk_l2norm:
    q, k = l2norm(q), l2norm(k)
  q, k, v = (x.astype(acc) for x in (q, k, v))
  u, e, z = build(k, v, *[x.astype(acc) for x in gates])
  return tuple(x.astype(io_dtype) for x in (q, u, e, z))


def _kernel(*refs, build, use_qk_l2norm, num_gates, acc):
  q_ref, k_ref, v_ref, gate_refs, out_refs = refs[0], refs[1], refs[2], refs[3:3 + num_gates], refs[3 + num_gates:]
  q, k, v = (r[...].astype(acc) for r in (q_ref, k_ref, v_ref))
  if use_qk_l2norm:
    q, k = l2norm(q), l2norm(k)
  u, e, z = build(k, v, *[r[...].astype(acc) for r in gate_refs])
  for ref, x in zip(out_refs, (q, u, e, z)):
    ref[...] = jnp.broadcast_to(x, ref.shape).astype(ref.dtype)


def _block(x, rows):
  """Rows of one (batch, head) of a [B, T, H] or [B, T, H, D] array, for a (B, H, T / rows) grid."""
  if x.ndim == 3:
    return pl.BlockSpec((pl.squeezed, rows, pl.squeezed), lambda b, h, t: (b, t, h))
  return pl.BlockSpec((pl.squeezed, rows, pl.squeezed, x.shape[-1]), lambda b, h, t: (b, t, h, 0))


def _fused(build, use_qk_l2norm, io_dtype, interpret, launch, q, k, v, *gates):
  B, T, H, K = q.shape
  V = v.shape[-1]
  rows, warps = launch
  Tp = -(-T // rows) * rows
  pad = lambda x: x if Tp == T else jnp.pad(x, [(0, 0), (0, Tp - T)] + [(0, 0)] * (x.ndim - 2))
  q, k, v, *gates = (pad(x) for x in (q, k, v, *gates))
  out = (jax.ShapeDtypeStruct((B, Tp, H, K), io_dtype),) * 3 + (jax.ShapeDtypeStruct((B, Tp, H, V), io_dtype),)
  outs = pl.pallas_call(
      functools.partial(_kernel, build=build, use_qk_l2norm=use_qk_l2norm, num_gates=len(gates),
                        acc=accumulation_dtype(io_dtype, q, k, v, *gates)),
      out_shape=out, grid=(B, H, Tp // rows),
      in_specs=[_block(x, rows) for x in (q, k, v, *gates)],
      out_specs=tuple(_block(x, rows) for x in out),
      compiler_params=pltriton.CompilerParams(num_warps=warps, num_stages=1), interpret=interpret,
      name="mixer_inputs")(q, k, v, *gates)
  return tuple(x[:, :T] for x in outs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _mixer_inputs(build, use_qk_l2norm, io_dtype, interpret, launch, q, k, v, *gates):
  return _fused(build, use_qk_l2norm, io_dtype, interpret, launch, q, k, v, *gates)


def _fwd(build, use_qk_l2norm, io_dtype, interpret, launch, *inputs):
  return _fused(build, use_qk_l2norm, io_dtype, interpret, launch, *inputs), inputs


def _bwd(build, use_qk_l2norm, io_dtype, interpret, launch, inputs, cotangents):
  _, vjp = jax.vjp(functools.partial(reference_inputs, build, use_qk_l2norm, io_dtype), *inputs)
  return vjp(cotangents)


_mixer_inputs.defvjp(_fwd, _bwd)


def fits(q, v):
  """Whether the kernel takes these head dims: K and V powers of two >= 16 (Triton blocks)."""
  return all(d >= 16 and d & (d - 1) == 0 for d in (q.shape[-1], v.shape[-1]))


def mixer_inputs(build, use_qk_l2norm, io_dtype, q, k, v, *gates, rows=ROWS, num_warps=WARPS, interpret=False):
  """(q, u, e, z) in io_dtype, as `reference_inputs` gives them, in one launch of `rows` tokens per program
  (a power of two); differentiable.

  q, k [B, T, H, K]; v [B, T, H, V]; gates (all but g) [B, T, H], [B, T, H, K] or [B, T, H, V] (any T; K and V
  as `fits` says). Inputs the kernel does not take go to `reference_inputs`.
  """
  if rows < 1 or rows & (rows - 1):
    raise ValueError(f"rows: expected a power of two, got {rows}")
  if not fits(q, v):
    return reference_inputs(build, use_qk_l2norm, io_dtype, q, k, v, *gates)
  return _mixer_inputs(build, use_qk_l2norm, jnp.dtype(io_dtype), interpret, (rows, num_warps), q, k, v, *gates)
