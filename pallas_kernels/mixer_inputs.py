"""How impl="pallas" forms a mixer's inputs to the generalized rule (DESIGN.md section 1).

A mixer gives q, k, v, its log decay g, its other gates and `build(k, v, *gates) -> (u, e, z)`. Two ways:

- `Form`: the forward kernels form u, e and z themselves, block by block, from the arrays they read (and
  normalize q and k when asked). The forward without gradients uses it, so no launch writes q, u, e, z and
  no kernel reads them back.
- `mixer_inputs`: one Pallas launch per (batch, head, block of rows) reads each input once and writes q, u, e,
  z in the io dtype, which the backward kernels read again. The forward for gradients uses it. Done by XLA,
  the l2norm of q and k, build and the casts are three or four fusions that read k twice (slower on the H200:
  benchmarks/ops/README.md, launch settings). Its launch settings: `MixerInputsSettings`.

The backward of both is XLA's: autodiff of the reference forming (`sdm_jax/ops/inputs.py`), the same arithmetic
on whole arrays (which is also how the other impls form their inputs). g is not read here; it goes to the rule as it is.
"""

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
from jax.extend.core import Var

from pallas_kernels.launch import one_at_a_time

EPS = 1e-6


def _normalized(x):
  """x / ||x|| over the last axis in fp32 (or float64), as the reference's l2norm (sdm_jax/ops/inputs.py)."""
  x = x.astype(jnp.promote_types(jnp.float32, x.dtype))
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + EPS)


class Form(NamedTuple):
  """How a forward kernel forms u, e, z from the arrays it reads: k, v, then the gates other than g.

  build(k, v, *gates) -> (u, e, z), elementwise per token and channel, giving zeros for zero k and v (padding
  relies on it). kinds: per array "key" ([B, T, H, K]), "value" ([B, T, H, V]) or "head" ([B, T, H]). l2norm:
  normalize q and k first. needs: per output of build, the indices of the arrays it reads (`form` finds them).
  """
  build: Callable
  kinds: tuple
  l2norm: bool
  needs: tuple

  def take(self, refs, rows, cols, outputs, k_norm=None):
    """The outputs of build named in outputs (of `OUTPUTS`: "u", "e", "z"), in that order, as fp32 blocks,
    loading only the arrays they need.

    rows: a slice, or an index vector (a gathered load); cols: a pl.ds over key channels for u and e, value
    channels for z. k_norm: 1 / ||k|| of those rows when l2norm. Arrays not needed get zeros, whose
    arithmetic the compiler drops."""
    at = [OUTPUTS.index(name) for name in outputs]
    need = frozenset().union(*(self.needs[o] for o in at))
    n = refs[0].shape[0] if isinstance(rows, slice) else rows.shape[0]
    args = []
    for i, (ref, kind) in enumerate(zip(refs, self.kinds)):
      if i not in need:
        args.append(jnp.zeros((n,) if kind == "head" else (n, cols.size), jnp.float32))
      elif kind == "head":
        args.append(ref[rows].astype(jnp.float32))
      else:
        args.append(ref[rows, cols].astype(jnp.float32))
    if k_norm is not None and 0 in need:  # array 0 is k
      args[0] = args[0] * k_norm[:, None]
    out = self.build(*args)
    return [out[o] for o in at]

  def check(self, K, V):
    """u and e are taken at key channels, z at value ones: with K != V each may read only its side's arrays
    (and head ones)."""
    for name, side, need in zip(OUTPUTS, ("key", "key", "value"), self.needs):
      if K != V and any(self.kinds[i] not in (side, "head") for i in need):
        raise ValueError(f"build: with K={K} != V={V}, {name} may read only {side} and head arrays, but reads "
                         f"{sorted(self.kinds[i] for i in need)}")


# What build returns, in its order (Form.needs follows it).
OUTPUTS = ("u", "e", "z")
KIND_SHAPES = {"key": (2, 8), "value": (2, 8), "head": (2,)}


def form(build, kinds, l2norm):
  """The `Form` of a build, with the arrays each output reads found from its jaxpr."""
  kinds = tuple(kinds)
  if kinds[:2] != ("key", "value") or any(k not in KIND_SHAPES for k in kinds):
    raise ValueError(f"kinds: expected ('key', 'value', then 'key', 'value' or 'head' per gate), got {kinds}")
  jaxpr = jax.make_jaxpr(build)(*[jax.ShapeDtypeStruct(KIND_SHAPES[k], jnp.float32) for k in kinds]).jaxpr
  reads = {v: frozenset([i]) for i, v in enumerate(jaxpr.invars)}
  for eqn in jaxpr.eqns:
    used = frozenset().union(*(reads.get(v, frozenset()) for v in eqn.invars if isinstance(v, Var)))
    reads.update((v, used) for v in eqn.outvars)
  needs = tuple(reads.get(v, frozenset()) if isinstance(v, Var) else frozenset() for v in jaxpr.outvars)
  if len(needs) != 3:
    raise ValueError(f"build: expected it to return (u, e, z), got {len(needs)} outputs")
  return Form(build, kinds, l2norm, needs)


def _formed(u, z, e):
  return u, e, z


# Inputs already formed (generalized_delta_rule, and the forward for gradients): the kernels read u, z, e.
FORMED = form(_formed, ("key", "value", "key"), False)


def row_norms(ref, width):
  """[rows] 1 / ||x|| of each row of a [rows, D] ref as `_normalized` takes it, width columns at a time."""
  rows, D = ref.shape

  def add(i, acc):
    x = ref[:, pl.ds(i * width, width)].astype(jnp.float32)
    return acc + jnp.sum(x * x, axis=1)

  return jax.lax.rsqrt(jax.lax.fori_loop(0, D // width, add, jnp.zeros((rows,), jnp.float32)) + EPS)


def _kernel(*refs, build, use_qk_l2norm, num_gates, acc):
  q_ref, k_ref, v_ref, gate_refs, out_refs = refs[0], refs[1], refs[2], refs[3:3 + num_gates], refs[3 + num_gates:]
  q, k, v = (r[...].astype(acc) for r in (q_ref, k_ref, v_ref))
  if use_qk_l2norm:
    q, k = _normalized(q), _normalized(k)
  u, e, z = build(k, v, *[r[...].astype(acc) for r in gate_refs])
  for ref, x in zip(out_refs, (q, u, e, z)):
    ref[...] = jnp.broadcast_to(x, ref.shape).astype(ref.dtype)


def _block(x, rows):
  """Rows of one (batch, head) of a [B, T, H] or [B, T, H, D] array, for a (B, H, T / rows) grid."""
  if x.ndim == 3:
    return pl.BlockSpec((pl.squeezed, rows, pl.squeezed), lambda b, h, t: (b, t, h))
  return pl.BlockSpec((pl.squeezed, rows, pl.squeezed, x.shape[-1]), lambda b, h, t: (b, t, h, 0))


def fits(q, v):
  """Whether the kernel takes these head dims: K and V powers of two >= 16 (Triton blocks)."""
  return all(d >= 16 and d & (d - 1) == 0 for d in (q.shape[-1], v.shape[-1]))


@dataclasses.dataclass(frozen=True)
class MixerInputsSettings:
  """Launch settings of `mixer_inputs`: rows tokens per program (a power of two) and its warps."""
  rows: int
  num_warps: int

  @classmethod
  def defaults(cls, shape=None):
    """32 rows at 4 warps at every shape."""
    # 16 to 64 rows at 4 or 8 warps are within a few percent of each other, near the byte floor, for GDN-2 and
    # KDA inputs on the H200 (benchmarks/ops/README.md, launch settings).
    return cls(rows=32, num_warps=4)

  @classmethod
  def candidates(cls, shape=None):
    return one_at_a_time(cls, shape, rows=(16, 64), num_warps=(8,))


SETTINGS = (MixerInputsSettings,)


def mixer_inputs(build, use_qk_l2norm, io_dtype, q, k, v, *gates, settings=None, interpret=False):
  """(q, u, e, z) in io_dtype, as the reference forming (`sdm_jax.ops.inputs.reference_inputs`) gives them, in one
  launch of settings.rows tokens per program (`MixerInputsSettings`; None: its defaults). Not differentiable
  itself: impl="pallas" differentiates the reference instead.

  q, k [B, T, H, K]; v [B, T, H, V]; gates (all but g) [B, T, H], [B, T, H, K] or [B, T, H, V] (any T; K and V
  as `fits` says: the caller forms other inputs by the reference).
  """
  settings = MixerInputsSettings.defaults() if settings is None else settings
  rows = settings.rows
  if rows < 1 or rows & (rows - 1):
    raise ValueError(f"settings.rows: expected a power of two, got {rows}")
  io_dtype = jnp.dtype(io_dtype)
  if not fits(q, v):
    raise ValueError(f"q, v: expected head dims that are powers of two >= 16, got K = {q.shape[-1]}, "
                     f"V = {v.shape[-1]}")
  B, T, H, K = q.shape
  V = v.shape[-1]
  Tp = -(-T // rows) * rows
  pad = lambda x: x if Tp == T else jnp.pad(x, [(0, 0), (0, Tp - T)] + [(0, 0)] * (x.ndim - 2))
  q, k, v, *gates = (pad(x) for x in (q, k, v, *gates))
  out = (jax.ShapeDtypeStruct((B, Tp, H, K), io_dtype),) * 3 + (jax.ShapeDtypeStruct((B, Tp, H, V), io_dtype),)
  outs = pl.pallas_call(
      functools.partial(_kernel, build=build, use_qk_l2norm=use_qk_l2norm, num_gates=len(gates),
                        acc=jnp.result_type(jnp.float32, io_dtype, *[x.dtype for x in (q, k, v, *gates)])),
      out_shape=out, grid=(B, H, Tp // rows),
      in_specs=[_block(x, rows) for x in (q, k, v, *gates)],
      out_specs=tuple(_block(x, rows) for x in out),
      compiler_params=pltriton.CompilerParams(num_warps=settings.num_warps, num_stages=1), interpret=interpret,
      name="mixer_inputs")(q, k, v, *gates)
  return tuple(x[:, :T] for x in outs)
