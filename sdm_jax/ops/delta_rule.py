"""The generalized gated delta rule behind every dense mixer (DESIGN.md section 1).

    S_t = (I - u_t e_t^T) Diag(exp(g_t)) S_{t-1} + u_t z_t^T,     o_t = scale * S_t^T q_t

A mixer only builds the write key u, the erase key e, the written value z and the log decay g,
then calls `run_mixer`, which checks the inputs and dispatches to an implementation.
"""

import jax
import jax.numpy as jnp

from pallas_kernels.mixer_inputs import FORMED, form
from sdm_jax.ops.chunk import CHUNK_SIZE, delta_rule_chunk
from sdm_jax.ops.inputs import accumulation_dtype, l2norm, reference_inputs
from sdm_jax.ops.pallas import PallasOpSettings, delta_rule_pallas
from sdm_jax.ops.scan import delta_rule_scan
from sdm_jax.ops.segments import check_segment_ids, kernel_masks, mask_inputs, mask_padding
from sdm_jax.ops.validation import check_options, check_scale, check_shape, chunk_size_for, empty_outputs

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


def chunk_size_of(impl, chunk_size, T):
  """The chunk size `impl` ("scan", "chunk" or "pallas": resolved, not "auto") runs T tokens at.

  chunk_size: an int, or None for the impl's rule (DESIGN.md section 2): impl="pallas" `PallasOpSettings.default()`
  (its kernels take 16, 32 or 64, never clamped); impl="chunk" `chunk.CHUNK_SIZE`. The chunked form's size, given or
  not, is clamped to T's padded length (`validation.chunk_size_for`); impl="scan" has no chunks and ignores it."""
  if impl == "pallas":
    return PallasOpSettings.default().chunk_size if chunk_size is None else chunk_size
  return chunk_size_for(CHUNK_SIZE if chunk_size is None else chunk_size, T)


def generalized_delta_rule(q, u, e, z, g, *, scale=None, initial_state=None, impl="auto", chunk_size=None,
                           io_dtype=None, segment_ids=None):
  """Runs the generalized rule on already-formed keys and values.

  q, u, e: [B, T, H, K]; z: [B, T, H, V]; g: [B, T, H, K] or [B, T, H] (scalar decay per head);
  initial_state: [B, H, K, V] or None. Computes in fp32 (float64 when the inputs are float64).
  impl: "auto" ("pallas" on a GPU, else "chunk"), "scan", "chunk" or "pallas".
  chunk_size: a power of two, or None for the impl's rule (`chunk_size_of`).
  io_dtype: the dtype q, u, e, z are stored in for impl="pallas" (default: that of z).
  segment_ids: None or int [B, T], documents packed into rows (DESIGN.md section 9): each starts from the zero
  state but the first of a row (initial_state), padding (id 0) is inert with output 0, the final state is the
  last document's.
  Returns (o [B, T, H, V] in the accumulation dtype, final state [B, H, K, V]).
  """
  impl = check_options(impl, chunk_size, rule=True)
  check_scale(scale)
  dims = {}
  for name, x, names in (("q", q, KEY), ("u", u, KEY), ("e", e, KEY), ("z", z, VALUE)):
    check_shape(name, x, names, dims)
  check_shape("g", g, HEAD if g.ndim == 3 else KEY, dims)
  if initial_state is not None:
    check_shape("initial_state", initial_state, STATE, dims)
  acc = jnp.result_type(jnp.float32, q.dtype, u.dtype, e.dtype, z.dtype, g.dtype)
  if (empty := empty_outputs(dims, acc, acc, initial_state)) is not None:
    return empty
  chunk_size = chunk_size_of(impl, chunk_size, dims["T"])
  starts = keep = None
  if segment_ids is not None:
    segment_ids = check_segment_ids(segment_ids, dims)
    if impl == "pallas":  # u and e are the keys themselves
      starts, keep, _ = kernel_masks(segment_ids)
      q, u, e = mask_padding(segment_ids, (q, u, e))
    else:
      (q, u, e, z), g, starts = mask_inputs(segment_ids, (q, u, e, z), g)
  acc = jnp.result_type(jnp.float32, q.dtype, u.dtype, e.dtype, z.dtype, g.dtype)
  io_dtype = z.dtype if io_dtype is None else io_dtype
  g, scale, state = _rule_options(q, z, g, scale, initial_state, acc, per_head=impl == "pallas")
  if impl == "pallas":
    o, final_state = delta_rule_pallas(FORMED, q, u, z, (e,), g, scale, state, chunk_size, io_dtype, starts, keep)
    return o.astype(acc), final_state.astype(acc)
  q, u, e, z = (x.astype(acc) for x in (q, u, e, z))
  if impl == "scan":
    return delta_rule_scan(q, u, e, z, g, scale, state, starts)
  return delta_rule_chunk(q, u, e, z, g, scale, state, chunk_size, starts)


def run_mixer(build, q, k, v, gates, *, scale, initial_state, output_final_state, use_qk_l2norm, impl,
              chunk_size, segment_ids=None, writes_vanish_with_k=False):
  """Checks a mixer's inputs, forms (u, e, z) = build(k, v, *gates other than g) and runs the rule.

  gates: ordered {name: (array, kind in GATE_KINDS)}, the log decay g first. impl="pallas" hands build to its
  kernels (`pallas.delta_rule_pallas`, io in v's dtype); the others form q, u, e, z by XLA in the accumulation
  dtype.
  impl "auto" is resolved here, once ("pallas" on a GPU, else "chunk").
  segment_ids: None or int [B, T] (`generalized_delta_rule`); q, k, v, g and the gates are zeroed on padding
  (and g at document starts) before anything reads them, so they get exactly zero gradient there; impl="pallas"
  zeroes only q and k, and g, in its kernels when writes_vanish_with_k (the build's u and e are zero wherever k is:
  `registry.Mixer`), which spares passes over the inputs (`segments.kernel_masks`; for gradients q and k are
  zeroed by XLA before the launch that forms the kernels' inputs).
  Returns (o [B, T, H, V] in v.dtype, final state [B, H, K, V] or None).
  """
  impl = check_options(impl, chunk_size, rule=True)
  check_scale(scale)
  dims = {}
  check_shape("q", q, KEY, dims)
  check_shape("k", k, KEY, dims)
  check_shape("v", v, VALUE, dims)
  for name, (x, kind) in gates.items():
    check_shape(name, x, GATE_KINDS[kind], dims)
  if initial_state is not None:
    check_shape("initial_state", initial_state, STATE, dims)
  g, *arrays = [x for x, _ in gates.values()]
  if (empty := empty_outputs(dims, v.dtype, accumulation_dtype(v.dtype, q, k, g, *arrays), initial_state)) is not None:
    return empty[0], empty[1] if output_final_state else None
  chunk_size = chunk_size_of(impl, chunk_size, dims["T"])
  starts = keep = real = None
  if segment_ids is not None:
    segment_ids = check_segment_ids(segment_ids, dims)
    if impl == "pallas" and writes_vanish_with_k:  # q and k are zeroed on padding inside delta_rule_pallas
      starts, keep, real = kernel_masks(segment_ids)
    else:
      (q, k, v, *arrays), g, starts = mask_inputs(segment_ids, (q, k, v, *arrays), g)
  if impl == "pallas":
    kinds = ("key", "value") + tuple(kind for _, kind in list(gates.values())[1:])
    acc = accumulation_dtype(v.dtype, q, k, v, g, *arrays)
    g, scale, state = _rule_options(q, v, g, scale, initial_state, acc, per_head=True)
    o, final_state = delta_rule_pallas(form(build, kinds, use_qk_l2norm), q, k, v, arrays, g, scale, state,
                                       chunk_size, v.dtype, starts, keep, real)
    return o.astype(v.dtype), final_state.astype(acc) if output_final_state else None
  acc = accumulation_dtype(v.dtype, q, k, g, *arrays)
  q, u, e, z = reference_inputs(build, use_qk_l2norm, acc, q, k, v, *arrays)
  # The formed inputs are zero on padding already; generalized_delta_rule's masking of them again is a no-op.
  o, final_state = generalized_delta_rule(q, u, e, z, g, scale=scale, initial_state=initial_state, impl=impl,
                                          chunk_size=chunk_size, segment_ids=segment_ids)
  return o.astype(v.dtype), final_state if output_final_state else None
