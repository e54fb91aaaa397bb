"""The generalized gated delta rule behind every dense mixer (DESIGN.md section 1).

    S_t = (I - u_t e_t^T) Diag(exp(g_t)) S_{t-1} + u_t z_t^T,     o_t = scale * S_t^T q_t

A mixer only builds the write key u, the erase key e, the written value z and the log decay g,
then calls `run_mixer`, which checks the inputs and runs an implementation of `IMPLEMENTATIONS`.
"""

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from pallas_kernels.chunk_math import check_lower_bound
from pallas_kernels.mixer_inputs import FORMED, form
from sdm_jax.ops.chunk import CHUNK_SIZE, delta_rule_chunk
from sdm_jax.ops.implementations import pick
from sdm_jax.ops.inputs import accumulation_dtype, l2norm, reference_inputs
from sdm_jax.ops.pallas import PallasOpSettings, delta_rule_pallas
from sdm_jax.ops.scan import delta_rule_scan
from sdm_jax.ops.segments import check_segment_ids, kernel_masks, mask_inputs, mask_padding
from sdm_jax.ops.validation import check_chunk_size, check_scale, check_shape, chunk_size_for, empty_outputs

KEY = ("B", "T", "H", "K")
VALUE = ("B", "T", "H", "V")
HEAD = ("B", "T", "H")
STATE = ("B", "H", "K", "V")
# A gate's kind and its dimension names.
GATE_KINDS = {"head": HEAD, "key": KEY, "value": VALUE}


def _rule_options(q, z, g, scale, initial_state, acc, per_head=False):
  """(g, scale, initial state) in the accumulation dtype, defaults filled in. g [B, T, H] (one decay per head) is
  broadcast to [B, T, H, K] unless per_head (impl="pallas", whose kernels read it as it is)."""
  B, T, H, K = q.shape
  if g.ndim == 3 and not per_head:
    g = jnp.broadcast_to(g[..., None], (B, T, H, K))
  scale = K**-0.5 if scale is None else scale
  state = jnp.zeros((B, H, K, z.shape[-1]), acc) if initial_state is None else initial_state
  return g.astype(acc), scale, state.astype(acc)


@dataclasses.dataclass(frozen=True)
class ChunkConfig:
  """The chunked form's rule when the op is not told a chunk size: chunk_size (`chunk.CHUNK_SIZE`), clamped, like a
  given size, to T's padded length (`validation.chunk_size_for`)."""
  chunk_size: int = CHUNK_SIZE


@dataclasses.dataclass(frozen=True)
class XlaImplementation:
  """An implementation by XLA on formed inputs (`implementations.Implementation`): run(q, u, e, z, g, scale, state,
  chunk_size, starts) gets q, u, e, z [B, T, H, K or V] masked and in the accumulation dtype, g [B, T, H, K], and
  returns (o [B, T, H, V], final state [B, H, K, V]); `run_mixer` forms a mixer's inputs for it
  (`inputs.reference_inputs`)."""
  name: str
  config: ChunkConfig = ChunkConfig()
  # Whether the kernels form u, e, z and mask padding themselves (`Pallas`).
  in_kernels: ClassVar[bool] = False
  # Whether the op's lower_bound changes how it computes (`Pallas`); the others take it and ignore it.
  uses_lower_bound: ClassVar[bool] = False

  def chunk_size(self, chunk_size, T):
    """The chunk size T tokens run at: chunk_size (None: the config's), clamped to T's padded length."""
    return chunk_size_for(self.config.chunk_size if chunk_size is None else chunk_size, T)


@dataclasses.dataclass(frozen=True)
class Scan(XlaImplementation):
  """impl="scan": token by token, the ground truth (`scan.delta_rule_scan`). It has no chunks and ignores the chunk
  size (`chunk_size` answers the chunked form's, so that a layer's cost counts one)."""
  name: str = "scan"

  def supported(self, backend):
    return False  # T sequential steps on every backend: run when named, never picked by "auto"

  def run(self, q, u, e, z, g, scale, state, chunk_size, starts):
    return delta_rule_scan(q, u, e, z, g, scale, state, starts)


@dataclasses.dataclass(frozen=True)
class Chunk(XlaImplementation):
  """impl="chunk": the chunked form in pure JAX (`chunk.delta_rule_chunk`, DESIGN.md section 2)."""
  name: str = "chunk"

  def supported(self, backend):
    return True

  def run(self, q, u, e, z, g, scale, state, chunk_size, starts):
    return delta_rule_chunk(q, u, e, z, g, scale, state, chunk_size, starts)


@dataclasses.dataclass(frozen=True)
class Pallas:
  """impl="pallas": the kernels (`pallas.delta_rule_pallas`; interpret mode off a GPU). run(form, q, k, v, gates, g,
  scale, state, chunk_size, io_dtype, starts, keep, real) hands the kernels the mixer's inputs and `form` (a
  mixer_inputs.Form; `FORMED` for formed ones), g [B, T, H] as it is, the padding masks (`segments.kernel_masks`) and
  the caller's lower_bound on g (`generalized_delta_rule`), and returns (o [B, T, H, V] in io_dtype, final state
  [B, H, K, V] fp32)."""
  name: str = "pallas"
  config: PallasOpSettings = PallasOpSettings.defaults()
  in_kernels: ClassVar[bool] = True
  uses_lower_bound: ClassVar[bool] = True

  def supported(self, backend):
    return backend == "gpu"

  def chunk_size(self, chunk_size, T):
    """chunk_size, or the config's when None; never clamped (the kernels take 16, 32, 64 whatever T)."""
    return self.config.chunk_size if chunk_size is None else chunk_size

  def run(self, form, q, k, v, gates, g, scale, state, chunk_size, io_dtype, starts, keep, real=None,
          lower_bound=None):
    return delta_rule_pallas(form, q, k, v, gates, g, scale, state, chunk_size, io_dtype, starts, keep, real,
                             lower_bound)


# The dense rule's implementations in impl="auto"'s order: the kernels on a GPU, the chunked form elsewhere.
IMPLEMENTATIONS = {impl.name: impl for impl in (Pallas(), Chunk(), Scan())}


def chunk_size_of(impl, chunk_size, T):
  """The chunk size the implementation named `impl` (resolved, not "auto") runs T tokens at: chunk_size, or None for
  its rule (DESIGN.md section 2): impl="pallas" `PallasOpSettings.defaults()` (its kernels take 16, 32 or 64, never
  clamped); impl="chunk" `chunk.CHUNK_SIZE`. The chunked form's size, given or not, is clamped to T's padded length
  (`validation.chunk_size_for`); impl="scan" has no chunks and ignores it."""
  return pick(impl, IMPLEMENTATIONS).chunk_size(chunk_size, T)


def check_bound(lower_bound, chunk_size, scalar_decay=False):
  """The dense ops' check of lower_bound (`chunk_math.check_lower_bound`), whatever impl runs: at the chunk size
  impl="pallas" runs (chunk_size; None: its rule), never with one decay per head (scalar_decay), so that a call one
  impl takes every impl takes (the others ignore the bound). A layer checks its bound with it when it is built."""
  return check_lower_bound(lower_bound, IMPLEMENTATIONS["pallas"].chunk_size(chunk_size, None), scalar_decay)


def _check(impl, chunk_size, scale, arrays, initial_state, segment_ids, empty_dtypes, lower_bound=None):
  """The checks of both entry points, in order: impl (`IMPLEMENTATIONS`; "auto" picked here, once), chunk_size,
  scale, then arrays ((name, x, dimension names)) and initial_state against one binding of B, T, H, K, V, then
  lower_bound (`chunk_math.check_lower_bound`): with per-channel g only, and at the chunk size impl="pallas" runs
  whatever impl runs, so that a call one impl takes every impl takes (the others ignore the bound).

  Returns (empty, None) when a dimension is 0, empty the result `validation.empty_outputs` in empty_dtypes() (o
  dtype, state dtype; called once the shapes are checked); else (None, (implementation, the chunk size it runs,
  segment_ids checked and int32, or None))."""
  implementation = pick(impl, IMPLEMENTATIONS)
  check_chunk_size(chunk_size, rule=True)
  check_scale(scale)
  dims = {}
  for name, x, names in arrays:
    check_shape(name, x, names, dims)
  if initial_state is not None:
    check_shape("initial_state", initial_state, STATE, dims)
  check_bound(lower_bound, chunk_size, next(names for name, _, names in arrays if name == "g") == HEAD)
  if (empty := empty_outputs(dims, *empty_dtypes(), initial_state)) is not None:
    return empty, None
  if segment_ids is not None:
    segment_ids = check_segment_ids(segment_ids, dims)
  return None, (implementation, implementation.chunk_size(chunk_size, dims["T"]), segment_ids)


def generalized_delta_rule(q, u, e, z, g, *, scale=None, initial_state=None, impl="auto", chunk_size=None,
                           io_dtype=None, segment_ids=None, lower_bound=None):
  """Runs the generalized rule on already-formed keys and values.

  q, u, e: [B, T, H, K]; z: [B, T, H, V]; g: [B, T, H, K] or [B, T, H] (scalar decay per head);
  initial_state: [B, H, K, V] or None. Computes in fp32 (float64 when the inputs are float64).
  impl: a name in `IMPLEMENTATIONS` ("pallas", "chunk", "scan"), or "auto", the first supported on the backend
  ("pallas" on a GPU, else "chunk").
  chunk_size: a power of two, or None for the impl's rule (`chunk_size_of`).
  io_dtype: the dtype q, u, e, z are stored in for impl="pallas" (default: that of z).
  segment_ids: None or int [B, T], documents packed into rows (DESIGN.md section 9): each starts from the zero
  state but the first of a row (initial_state), padding (id 0) is inert with output 0, the final state is the
  last document's.
  lower_bound: None, or the caller's promise that every g >= lower_bound (fla's safe gate; DESIGN.md section 2),
  a number in [-160 / C, 0) for the chunk size C impl="pallas" runs (-5 at 32), per-channel g only. impl="pallas"
  then forms each decayed Gram matrix with one or two dots; a g below the bound may give inf or NaN there. The scan and
  impl="chunk" compute the same with or without it and ignore it.
  Returns (o [B, T, H, V] in the accumulation dtype, final state [B, H, K, V]).
  """
  arrays = (("q", q, KEY), ("u", u, KEY), ("e", e, KEY), ("z", z, VALUE), ("g", g, HEAD if g.ndim == 3 else KEY))
  accumulation = lambda: jnp.result_type(jnp.float32, q.dtype, u.dtype, e.dtype, z.dtype, g.dtype)
  empty, checked = _check(impl, chunk_size, scale, arrays, initial_state, segment_ids,
                          lambda: (accumulation(), accumulation()), lower_bound)
  if empty is not None:
    return empty
  implementation, chunk_size, segment_ids = checked
  starts = keep = None
  if segment_ids is not None:
    if implementation.in_kernels:  # u and e are the keys themselves
      starts, keep, _ = kernel_masks(segment_ids)
      q, u, e = mask_padding(segment_ids, (q, u, e))
    else:
      (q, u, e, z), g, starts = mask_inputs(segment_ids, (q, u, e, z), g)
  acc = jnp.result_type(jnp.float32, q.dtype, u.dtype, e.dtype, z.dtype, g.dtype)
  io_dtype = z.dtype if io_dtype is None else io_dtype
  g, scale, state = _rule_options(q, z, g, scale, initial_state, acc, per_head=implementation.in_kernels)
  if implementation.in_kernels:
    o, final_state = implementation.run(FORMED, q, u, z, (e,), g, scale, state, chunk_size, io_dtype, starts, keep,
                                        lower_bound=lower_bound)
    return o.astype(acc), final_state.astype(acc)
  q, u, e, z = (x.astype(acc) for x in (q, u, e, z))
  return implementation.run(q, u, e, z, g, scale, state, chunk_size, starts)


def run_mixer(build, q, k, v, gates, *, scale, initial_state, output_final_state, use_qk_l2norm, impl,
              chunk_size, segment_ids=None, lower_bound=None, writes_vanish_with_k=False):
  """Checks a mixer's inputs, forms (u, e, z) = build(k, v, *gates other than g) and runs the rule.

  gates: ordered {name: (array, kind in GATE_KINDS)}, the log decay g first. impl="pallas" hands build to its
  kernels (`pallas.delta_rule_pallas`, io in v's dtype); the others form q, u, e, z by XLA in the accumulation
  dtype.
  impl "auto" is resolved here, once (`IMPLEMENTATIONS`: "pallas" on a GPU, else "chunk").
  segment_ids: None or int [B, T] (`generalized_delta_rule`); q, k, v, g and the gates are zeroed on padding
  (and g at document starts) before anything reads them, so they get exactly zero gradient there; impl="pallas"
  zeroes only q and k, and g, in its kernels when writes_vanish_with_k (the build's u and e are zero wherever k is:
  `registry.Mixer`), which spares passes over the inputs (`segments.kernel_masks`; for gradients q and k are
  zeroed by XLA before the launch that forms the kernels' inputs).
  lower_bound: None, or the caller's promise g >= lower_bound (`generalized_delta_rule`).
  Returns (o [B, T, H, V] in v.dtype, final state [B, H, K, V] or None).
  """
  g, *arrays = [x for x, _ in gates.values()]
  named = (("q", q, KEY), ("k", k, KEY), ("v", v, VALUE),
           *((name, x, GATE_KINDS[kind]) for name, (x, kind) in gates.items()))
  empty, checked = _check(impl, chunk_size, scale, named, initial_state, segment_ids,
                          lambda: (v.dtype, accumulation_dtype(v.dtype, q, k, g, *arrays)), lower_bound)
  if empty is not None:
    return empty[0], empty[1] if output_final_state else None
  implementation, chunk_size, segment_ids = checked
  starts = keep = real = None
  if segment_ids is not None:
    if implementation.in_kernels and writes_vanish_with_k:  # q and k are zeroed on padding inside delta_rule_pallas
      starts, keep, real = kernel_masks(segment_ids)
    else:
      (q, k, v, *arrays), g, starts = mask_inputs(segment_ids, (q, k, v, *arrays), g)
  if implementation.in_kernels:
    kinds = ("key", "value") + tuple(kind for _, kind in list(gates.values())[1:])
    acc = accumulation_dtype(v.dtype, q, k, v, g, *arrays)
    g, scale, state = _rule_options(q, v, g, scale, initial_state, acc, per_head=True)
    o, final_state = implementation.run(form(build, kinds, use_qk_l2norm), q, k, v, arrays, g, scale, state,
                                        chunk_size, v.dtype, starts, keep, real, lower_bound)
    return o.astype(v.dtype), final_state.astype(acc) if output_final_state else None
  acc = accumulation_dtype(v.dtype, q, k, g, *arrays)
  q, u, e, z = reference_inputs(build, use_qk_l2norm, acc, q, k, v, *arrays)
  # The formed inputs are zero on padding already; generalized_delta_rule's masking of them again is a no-op.
  o, final_state = generalized_delta_rule(q, u, e, z, g, scale=scale, initial_state=initial_state,
                                          impl=implementation.name, chunk_size=chunk_size, segment_ids=segment_ids)
  return o.astype(v.dtype), final_state if output_final_state else None
