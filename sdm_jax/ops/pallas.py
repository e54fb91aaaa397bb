"""impl="pallas": the generalized rule on the Pallas kernels (interpret mode off the GPU).

Forward: `pallas_kernels.delta_rule_fwd` (chunk_cumsum, intra_chunk, then state_pass). Without gradients the
kernels form u, e, z from the mixer's k, v and gates (`mixer_inputs.Form`). For gradients, a custom_vjp: the
forward writes q, u, e, z once (`mixer_inputs`) and saves for `pallas_kernels.delta_rule_bwd` (state_pass_bwd,
then intra_chunk_bwd) the `Residuals`: the padded q, u, e, z, G (the chunk cumsum of g, which every kernel reads),
the `ChunkTensors` with the fp32 inverse A, and the initial state; the backward runs the state pass again for the
state entering every chunk and R = U - Y S (saving them would hold 0.4 GiB per layer at 4 x 4096 with bf16 io); the
chunk states, R and their gradients are stored in bf16 under bf16 io (`delta_rule_fwd.saved_state_dtype`); the
gradients then go through the forming of q, u, e, z by autodiff of `inputs.reference_inputs`.
"""

import dataclasses
import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from pallas_kernels.delta_rule_bwd import intra_chunk_bwd, state_pass_bwd
from pallas_kernels.delta_rule_fwd import ChunkTensors, chunk_cumsum, intra_chunk, state_pass
from pallas_kernels.launch import one_at_a_time
from pallas_kernels.mixer_inputs import FORMED, fits, mixer_inputs
from sdm_jax.ops.inputs import reference_inputs
from sdm_jax.ops.segments import chunk_documents
from sdm_jax.ops.validation import on_gpu

# Chunk 128 is not offered: its backward kernel asks for more shared memory than a program may have, and its forward
# per-chunk kernels are several times slower than chunk 32's (benchmarks/ops/README.md, launch settings).
PALLAS_CHUNK_SIZES = (16, 32, 64)


@dataclasses.dataclass(frozen=True)
class PallasOpSettings:
  """What impl="pallas" runs with when the op is not told (chunk_size=None): chunk_size, one of PALLAS_CHUNK_SIZES.
  Its rule follows the kernels' settings protocol (`pallas_kernels.launch.LaunchSettings`)."""
  chunk_size: int

  @classmethod
  def defaults(cls, shape=None):
    """The rule: chunk 32 at every shape, on every device."""
    # Chunk 32 is the fastest forward+backward of the per-channel kernels (KDA's and GDN-2's) on the H200 and the H100
    # (benchmarks/ops/README.md, the H100 chunk-size table and the launch settings). Off the GPU (interpret mode)
    # nothing was measured; 32 keeps the kernels the GPU runs.
    return cls(chunk_size=32)

  @classmethod
  def candidates(cls, shape=None):
    """Every chunk size the kernels take, the rule's first."""
    return one_at_a_time(cls, shape, chunk_size=PALLAS_CHUNK_SIZES)


def next_pow2(n, floor=16):
  return max(floor, 1 << (n - 1).bit_length())


def _padding(T, K, V, chunk_size):
  """Padded (T, K, V): T to whole chunks, K and V to powers of two >= 16. Padded tokens have g = 0
  and zero keys, padded channels zero keys and values: they change nothing."""
  return -(-T // chunk_size) * chunk_size, next_pow2(K), next_pow2(V)


def _pad(x, T, d=None):
  if d is None:  # [B, T, H]
    return jnp.pad(x, ((0, 0), (0, T - x.shape[1]), (0, 0)))
  return jnp.pad(x, ((0, 0), (0, T - x.shape[1]), (0, 0), (0, d - x.shape[-1])))


def _pad_state(s, K, V):
  return jnp.pad(s, ((0, 0), (0, 0), (0, K - s.shape[2]), (0, V - s.shape[3])))


def interpret():
  return not on_gpu()


class Static(NamedTuple):
  """The options of the op that the custom_vjp does not differentiate, one hashable argument: form (the
  `mixer_inputs.Form` of the arrays after q), io_dtype, scale, chunk_size and lower_bound (None, or the caller's
  promise g >= lower_bound, with which the kernels form each decayed gram in one or two dots: `chunk_math.levels`)."""
  form: Any
  io_dtype: Any
  scale: float
  chunk_size: int
  lower_bound: Optional[float] = None


class Masks(NamedTuple):
  """Packed documents as the kernels take them, each None (unpacked) or [B, Tp] int32: documents
  (`segments.chunk_documents`, which the kernels mask their decays with); keep, nonzero where g counts
  (`chunk_cumsum`; the backward zeroes dg elsewhere); real, nonzero but on padding, where q and k are zeroed (by the
  forward kernels without gradients; for them by XLA before the forming launch, and again in the backward's forming,
  so that they get zero gradient there)."""
  documents: Optional[jax.Array] = None
  keep: Optional[jax.Array] = None
  real: Optional[jax.Array] = None


class Residuals(NamedTuple):
  """What the custom_vjp saves for `_bwd`. q, u, e [B, Tp, H, Kp], z [B, Tp, H, Vp] in the io dtype and G
  [B, Tp, H, Kp] fp32 ([B, Tp, H] with one decay per head), padded to whole chunks and kernel widths; chunks:
  `intra_chunk`'s `ChunkTensors` with A; initial_state [B, H, Kp, Vp] fp32, padded; T, K, V: the unpadded sizes;
  op_inputs: the op's (q, k, v, gates), which the backward differentiates the forming of q, u, e, z at, and masks
  the op's `Masks` (both set by `_fwd`)."""
  q: jax.Array
  u: jax.Array
  e: jax.Array
  z: jax.Array
  G: jax.Array
  chunks: ChunkTensors
  initial_state: jax.Array
  T: int
  K: int
  V: int
  op_inputs: Optional[tuple] = None
  masks: Masks = Masks()


def _forward(static, q, arrays, g, state, masks, save):
  """The rule on q and the arrays static.form builds u, e, z from; with save, also the backward's `Residuals` but
  op_inputs and masks (then the arrays must be the formed (u, z, e)). g: [B, T, H, K], or [B, T, H] with one decay
  per head, which every kernel then reads as such. masks: `Masks`."""
  form, io_dtype, scale, chunk_size, lower_bound = static
  B, T, H, K = q.shape
  V = arrays[1].shape[-1]
  Tp, Kp, Vp = _padding(T, K, V, chunk_size)
  width = {"key": Kp, "value": Vp, "head": None}
  q, g = _pad(q, Tp, Kp), _pad(g, Tp, Kp if g.ndim == 4 else None)
  arrays = tuple(_pad(x, Tp, width[kind]) for x, kind in zip(arrays, form.kinds))
  kw = dict(chunk_size=chunk_size, interpret=interpret())
  G = chunk_cumsum(g, keep=masks.keep, **kw)
  chunks = intra_chunk(q, arrays, G, form=form, io_dtype=io_dtype, save_inverse=save, scale=scale,
                       lower_bound=lower_bound, documents=masks.documents, real=masks.real, **kw)
  state = _pad_state(state, Kp, Vp)
  o, final_state = state_pass(chunks, state, **kw)
  out = (o[:, :T, :, :V], final_state[:, :, :K, :V])
  if not save:
    return out, None
  u, z, e = arrays
  return out, Residuals(q=q, u=u, e=e, z=z, G=G, chunks=chunks, initial_state=state, T=T, K=K, V=V)


def _masked_qk(real, q, k):
  """q and k zeroed where real is 0 (through jnp.where: zero gradient there); unchanged for real None."""
  if real is None:
    return q, k
  by_token = real[:, :q.shape[1], None, None] != 0
  return tuple(jnp.where(by_token, x, jnp.zeros((), x.dtype)) for x in (q, k))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _delta_rule_pallas(static, q, k, v, gates, g, state, masks):
  # Without gradients the kernels form u, e, z (and normalize q, k) from the arrays as they come, and zero q and k
  # on padding themselves.
  return _forward(static, q, (k, v, *gates), g, state, masks, save=False)[0]


def _written_inputs(form, io_dtype, q, k, v, gates):
  """(q, u, e, z) in io_dtype for the backward kernels: written by one launch, or by XLA when they come formed
  (a cast) or the launch does not take the head dims."""
  if form is FORMED or not fits(q, v):
    return _reference(form, io_dtype, q, k, v, gates)
  return mixer_inputs(form.build, form.l2norm, io_dtype, q, k, v, *gates, interpret=interpret())


def _fwd(static, q, k, v, gates, g, state, masks):
  # For gradients q and k are zeroed on padding by XLA, before the launch that forms q, u, e, z.
  q_, u, e, z = _written_inputs(static.form, static.io_dtype, *_masked_qk(masks.real, q, k), v, gates)
  out, residuals = _forward(static._replace(form=FORMED), q_, (u, z, e), g, state, masks._replace(real=None),
                            save=True)
  return out, residuals._replace(op_inputs=(q, k, v, gates), masks=masks)


def _reference(form, io_dtype, q, k, v, gates):
  return reference_inputs(form.build, form.l2norm, io_dtype, q, k, v, *gates)


def _bwd(static, residuals, cotangents):
  form, io_dtype, scale, chunk_size, lower_bound = static
  res = residuals
  T, K, V = res.T, res.K, res.V
  d_o, d_final = cotangents
  Tp, Kp, Vp = res.q.shape[1], res.q.shape[-1], res.z.shape[-1]
  kw = dict(chunk_size=chunk_size, interpret=interpret())
  # The states entering each chunk ([B, H, T/C, K, V], 256 MiB per layer in bf16 at B 4, T 4096, H 16, C 32) and
  # R are formed again here rather than saved: one more state pass, whose forward then writes neither.
  _, _, states, R = state_pass(res.chunks, res.initial_state, save_states=True, **kw)
  d_o = _pad(d_o.astype(res.z.dtype), Tp, Vp)
  d_r, d_state, d_states = state_pass_bwd(res.chunks, d_o, _pad_state(d_final.astype(jnp.float32), Kp, Vp), **kw)
  dq, du, de, dz, dg = intra_chunk_bwd(res.q, res.u, res.e, res.z, res.G, R, res.chunks.A, states, d_states, d_o,
                                       d_r, scale=scale, lower_bound=lower_bound, documents=res.masks.documents, **kw)
  key = lambda x: x[:, :T, :, :K]
  # Through the forming of q, u, e, z: autodiff of the XLA reference.
  _, vjp = jax.vjp(lambda q, k, v, gates: _reference(form, io_dtype, *_masked_qk(res.masks.real, q, k), v, gates),
                   *res.op_inputs)
  d_inputs = vjp((key(dq), key(du), key(de), dz[:, :T, :, :V]))
  # dg [B, T, H, K], or [B, T, H] with one decay per head.
  dg = key(dg) if dg.ndim == 4 else dg[:, :T]
  if res.masks.keep is not None:
    keep = res.masks.keep[:, :T, None] != 0
    dg = jnp.where(keep[..., None] if dg.ndim == 4 else keep, dg, 0.0)
  return (*d_inputs, dg, d_state[:, :, :K, :V], None)


_delta_rule_pallas.defvjp(_fwd, _bwd)


def delta_rule_pallas(form, q, k, v, gates, g, scale, initial_state, chunk_size, io_dtype, starts=None, keep=None,
                      real=None, lower_bound=None):
  """The rule on q and what `form` builds u, e, z from: k [B, T, H, K], v [B, T, H, V] and the gates other than
  g (`FORMED`: u, z, e). Without gradients the forward kernels form u, e, z themselves; for gradients one launch
  writes q, u, e, z in `io_dtype`, the kernels read them, and the backward kernels read them again.
  g [B, T, H, K], or [B, T, H] with one decay per head (GDN), which every kernel, forward and backward, then reads as
  one number per row (its gradient comes back [B, T, H]); g and the state travel in fp32. starts: None or [B, T]
  bool, where packed documents start: then the per-chunk kernels read `segments.chunk_documents` and mask every
  decay that spans a start (without it they are the unpacked kernels, unchanged). keep: None or [B, T] bool, where g
  counts (`segments.kernel_masks`): the cumsum kernel zeroes g elsewhere and the backward dg, instead of a pass over g
  before the kernels. real: None or [B, T] bool (with starts), false on padding: there q and k are zeroed (by the
  forward kernels without gradients, by XLA before the forming launch for them), for mixers whose u and e vanish with
  k (`Mixer.writes_vanish_with_k`). lower_bound: None, or the caller's promise g >= lower_bound (per-channel g only;
  the kernels check it at chunk_size: `chunk_math.check_lower_bound`), with which they form each decayed gram in one
  or two dots.
  Returns (o [B, T, H, V] in io_dtype, final state [B, H, K, V] fp32)."""
  if chunk_size not in PALLAS_CHUNK_SIZES:
    raise ValueError(f"chunk_size: impl='pallas' supports {PALLAS_CHUNK_SIZES} (at 128 its backward needs more "
                     f"shared memory than a GPU program has; impl='chunk' takes any power of two), got {chunk_size}")
  Tp = -(-q.shape[1] // chunk_size) * chunk_size
  pad = lambda mask: jnp.pad(mask, ((0, 0), (0, Tp - mask.shape[1])))
  documents = None if starts is None else chunk_documents(pad(starts), chunk_size)
  keep = None if keep is None else pad(keep).astype(jnp.int32)
  if real is not None and starts is None:
    raise ValueError("real: only with starts (packed documents)")
  real = None if real is None else pad(real).astype(jnp.int32)
  return _delta_rule_pallas(Static(form, jnp.dtype(io_dtype), scale, chunk_size, lower_bound), q, k, v, tuple(gates),
                            g.astype(jnp.float32), initial_state.astype(jnp.float32), Masks(documents, keep, real))
