"""Sparse Delta Memory: the sparse gated delta rule on a product-key-addressed table (DESIGN.md section 3).

Per head a table M [N, V]. At token t, with write slots I_t (weights kappa_t), read slots J_t
(weights rho_t), log decay g_t <= 0 and learning rate beta_t in [0, 1]:

    Mt[i] = exp(g_t) M[i]  for i in I_t  (other slots are not decayed)
    r_t   = sum_{i in I_t} kappa_t(i) Mt[i],   d_t = beta_t (v_t - r_t)
    M[i]  = Mt[i] + kappa_t(i) d_t  for i in I_t,   o_t = sum_{j in J_t} rho_t(j) M[j]

A slot listed twice in one token's I_t is one slot whose weight is the sum of its entries (the
dense-key reading: GDN with key vector k_t = sum_w kappa_t[w] e_{I_t[w]}); it is decayed once.

Packed documents (segment_ids, DESIGN.md section 9): every document starts from m0 (there is no other initial state),
so the table at a document start is m0 again; its decay g_t applies to m0's rows as at t = 0.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from sdm_jax.ops.implementations import configure
from sdm_jax.ops.segments import check_segment_ids, document_starts, mask_padding
from sdm_jax.ops.sparse_chunk import CHUNK_SIZE, ChunkConfig, sparse_delta_chunk, sparse_delta_chunk_packed
from sdm_jax.ops.sparse_pallas import PallasConfig, sparse_delta_pallas
from sdm_jax.ops.validation import check_array, check_shape, chunk_size_for

HIGHEST = jax.lax.Precision.HIGHEST


def _token_step(table, k_idx, k_w, v, g, beta, q_idx, q_w):
  """One token for one (batch, head): table [N, V]; k_idx, k_w [W]; v [V]; g, beta scalars; q_* [R]."""
  slot_weight = jnp.dot((k_idx[:, None] == k_idx[None, :]).astype(k_w.dtype), k_w, precision=HIGHEST)
  rows = jnp.exp(g) * table[k_idx]  # duplicates gather the same decayed row
  d = beta * (v - jnp.dot(k_w, rows, precision=HIGHEST))
  table = table.at[k_idx].set(rows + slot_weight[:, None] * d[None, :])
  return table, jnp.dot(q_w, table[q_idx], precision=HIGHEST)


def sparse_delta_scan(table, k_idx, k_w, v, g, beta, q_idx, q_w, starts=None):
  """Token-by-token reference; same shapes as `sparse_delta_chunk`. starts: None or [B, T] bool, where packed
  documents start: the carried table is replaced by the initial one (m0) there, before the token's step."""
  step = jax.vmap(jax.vmap(_token_step))  # over B, H
  m0 = table

  def body(table, xs):
    if starts is not None:
      *xs, start = xs
      table = jnp.where(start[:, None, None, None], m0, table)
    return step(table, *xs)

  xs = [jnp.moveaxis(x, 1, 0) for x in (k_idx, k_w, v, g, beta, q_idx, q_w) + (() if starts is None else (starts,))]
  final, o = jax.lax.scan(body, table, xs)
  return jnp.moveaxis(o, 0, 1), final


def _batch_table(m0, B):
  """m0 [H, N, V] or [B, H, N, V] -> the table every row of the batch starts from, [B, H, N, V]."""
  return jnp.broadcast_to(m0, (B, *m0.shape[-3:]))


# The implementations (`implementations.Implementation`). run(m0, k_idx, k_w, v, g, beta, q_idx, q_w, starts,
# distinct_slots) gets the op's checked inputs with padding masked: m0 [H, N, V] or [B, H, N, V] and k_w, g, beta, q_w
# in the accumulation dtype (fp32, float64 for float64 inputs), v in its own dtype, starts None or [B, T] bool (where
# packed documents start), and returns (o [B, T, H, V], which the op casts to v's dtype, final table [B, H, N, V]).


@dataclasses.dataclass(frozen=True)
class Scan:
  """impl="scan": token by token, the reference (`sparse_delta_scan`). It has no chunks and ignores chunk_size."""
  name: str = "scan"
  config: ChunkConfig = ChunkConfig()

  def supported(self, backend):
    return False  # T sequential steps on every backend: run when named, never picked by "auto"

  def run(self, m0, k_idx, k_w, v, g, beta, q_idx, q_w, starts, distinct_slots):
    return sparse_delta_scan(_batch_table(m0, v.shape[0]), k_idx, k_w, v.astype(m0.dtype), g, beta, q_idx, q_w,
                             starts)


@dataclasses.dataclass(frozen=True)
class Chunk:
  """impl="chunk": chunked WY with a memory-lean backward (`sparse_chunk`), config.chunk_size tokens per chunk,
  clamped to T's padded length."""
  name: str = "chunk"
  config: ChunkConfig = ChunkConfig()

  def supported(self, backend):
    return True

  def run(self, m0, k_idx, k_w, v, g, beta, q_idx, q_w, starts, distinct_slots):
    B, T = v.shape[:2]
    C = chunk_size_for(self.config.chunk_size, T)
    pad = -T % C
    # Padded tokens write and read with weight 0 and do not decay (g = 0): they change nothing.
    pad_t = lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    padded = map(pad_t, (k_idx, k_w, v.astype(m0.dtype), g, beta, q_idx, q_w))
    if starts is None:
      o, final = sparse_delta_chunk(_batch_table(m0, B), *padded, C)
    else:  # the padded tokens end the row's last run
      o, final = sparse_delta_chunk_packed(m0, *padded, pad_t(starts), C)
    return o[:, :T], final


@dataclasses.dataclass(frozen=True)
class Pallas:
  """impl="pallas": the kernels that walk the tokens in order on the touched rows (`sparse_pallas`; interpret mode
  off a GPU), with the options of PallasConfig."""
  name: str = "pallas"
  config: PallasConfig = PallasConfig()

  def supported(self, backend):
    return backend == "gpu"

  def run(self, m0, k_idx, k_w, v, g, beta, q_idx, q_w, starts, distinct_slots):
    # m0 unbroadcast (what a replay starts from) and v in its own dtype (the kernels read it as fp32): the same
    # bits as fp32 copies, without keeping them for the backward.
    return sparse_delta_pallas(m0, k_idx, k_w, v, g, beta, q_idx, q_w, self.config, starts=starts,
                               distinct_slots=distinct_slots)


# Sparse Delta Memory's implementations in impl="auto"'s order: the kernels on a GPU, the chunked form elsewhere.
IMPLEMENTATIONS = {impl.name: impl for impl in (Pallas(), Chunk(), Scan())}


def _check_indices(name, idx, N):
  """ValueError unless idx is an integer array of slots in [0, N). Concrete indices (also arrays a jitted caller
  closes over) are checked here on the host with NumPy, never with jnp, whose results under jit are tracers;
  traced ones only by a checkify check, which reports when the caller is checkify.checkify-ed."""
  if not jnp.issubdtype(idx.dtype, jnp.integer):
    raise ValueError(f"{name}: expected an integer dtype, got {idx.dtype}")
  if isinstance(idx, jax.core.Tracer):
    checkify.debug_check(jnp.all((idx >= 0) & (idx < N)), f"{name}: slot indices must lie in [0, {N})")
    return
  values = np.asarray(idx)
  lo, hi = (int(values.min()), int(values.max())) if values.size else (0, 0)
  if lo < 0 or hi >= N:
    raise ValueError(f"{name}: slot indices must lie in [0, N) = [0, {N}), got values in [{lo}, {hi}]")


def _check_distinct(name, idx):
  """With distinct_slots: ValueError if a token lists a slot twice in idx [..., W] (concrete indices, on the host;
  traced ones by a checkify check, as `_check_indices`)."""
  if isinstance(idx, jax.core.Tracer):
    ordered = jnp.sort(idx, axis=-1)
    checkify.debug_check(jnp.all(ordered[..., 1:] != ordered[..., :-1]),
                         f"{name}: distinct_slots=True, but a token lists a slot twice")
    return
  ordered = np.sort(np.asarray(idx), axis=-1)
  twice = np.argwhere(ordered[..., 1:] == ordered[..., :-1])
  if twice.size:
    at = tuple(int(i) for i in twice[0])
    raise ValueError(f"{name}: distinct_slots=True promises no slot twice among a token's entries, but the token at "
                     f"[b, t, h] = {list(at[:-1])} lists slot {int(ordered[at[:-1]][at[-1]])} twice")


def sparse_delta_rule(m0, k_idx, k_w, v, g, beta, q_idx, q_w, *, impl="auto", chunk_size=CHUNK_SIZE,
                      output_final_state=False, rows_dtype="float32", rows_segments=1, table_dtype="float32",
                      table_grad_dtype="float32", segment_ids=None, distinct_slots=False, launch=None):
  """The Sparse Delta Memory recurrence.

  m0: [H, N, V] (a learned table shared over the batch) or [B, H, N, V]; k_idx (int), k_w:
  [B, T, H, W]; v: [B, T, H, V]; g (log decay <= 0), beta: [B, T, H]; q_idx (int), q_w: [B, T, H, R].
  impl: a name in `IMPLEMENTATIONS`: "scan" (the reference), "chunk" (chunked WY with a memory-lean backward;
  chunk_size tokens per chunk) or "pallas" (Pallas kernels that walk the tokens in order on the touched rows, with
  the same memory-lean backward; interpret mode off the GPU), or "auto" (the default), the first supported on the
  backend ("pallas" on a GPU, else "chunk").
  The options are the fields of the implementations' configs, each checked by every config that has it whatever impl
  runs (ValueError naming it): chunk_size (a power of two; every impl's, only "chunk" uses it), and impl="pallas"'s
  (`sparse_pallas.PallasConfig`): rows_dtype ("float32" or "bfloat16"), rows_segments (an int >= 1), what its
  backward gets the rows each token found before its write from: saved in fp32 (the default), rounded to bf16, or
  saved for the last of rows_segments token segments and replayed from m0 for the others; table_dtype ("float32" or
  "bfloat16"), what the table is stored in while the kernels walk the tokens: bf16 rounds every written row (lossy,
  like a bf16 state; half the kernels' memory traffic); table_grad_dtype ("float32" or "bfloat16"), what the
  backward stores the table's cotangent in while it walks the tokens: bf16 rounds every row of it as it is stored
  (lossy gradients, the forward unchanged; the gradient of m0 is returned in fp32); launch, the token kernels'
  (forward, backward) launch settings, each (block_v, num_warps), None for the defaults: a tuning knob, the results
  the same up to the order of per-tile sums. An option set away from its default is refused by a named impl whose
  config lacks it (ValueError); impl="auto" runs the implementation it picks without it ("chunk" off a GPU: fp32).
  segment_ids: None or int [B, T], documents packed into rows (DESIGN.md section 9): equal nonzero ids in a run are
  one document, 0 is padding (after a row's last document). Each document starts from m0 (the row's, when m0 is
  [B, H, N, V]); a padding token reads and writes nothing (its k_w, v, g, beta and q_w are zeroed before use, so its
  output is 0 and its inputs get zero gradient); the final table is the table after the row's last document (m0 on
  the slots that document never wrote). The result equals each document run alone, for every impl and option.
  distinct_slots: True promises that no token lists a slot twice among its k_idx entries, nor among its q_idx ones
  (product-key addressing never does): impl="pallas" then takes each entry's weight as its slot's instead of
  grouping a token's entries by slot (sorts in the forward and the backward); the result is the same. Checked like
  the index range (below); the other impls, which need no grouping, only check it.
  Returns (o [B, T, H, V] in v.dtype, final table [B, H, N, V] fp32, or None); with B, T, H, N or V of 0, zeros
  and the table unchanged. Out-of-range indices raise ValueError where the index arrays are concrete (also arrays
  a jitted function closes over); traced indices are checkify's job (`checkify.checkify` reports them).
  """
  implementation = configure(impl, IMPLEMENTATIONS, {
      "chunk_size": chunk_size, "rows_dtype": rows_dtype, "rows_segments": rows_segments, "table_dtype": table_dtype,
      "table_grad_dtype": table_grad_dtype, "launch": launch})
  if not isinstance(distinct_slots, bool):
    raise ValueError(f"distinct_slots: expected True or False, got {distinct_slots!r}")
  dims = {}
  check_shape("v", v, ("B", "T", "H", "V"), dims)
  check_array("m0", m0)
  if m0.ndim == 3:
    check_shape("m0", m0, ("H", "N", "V"), dims)
  else:
    check_shape("m0", m0, ("B", "H", "N", "V"), dims)
  for name, x, names in (("k_w", k_w, ("B", "T", "H", "W")), ("g", g, ("B", "T", "H")),
                         ("beta", beta, ("B", "T", "H")), ("q_w", q_w, ("B", "T", "H", "R"))):
    check_shape(name, x, names, dims)
  for name, idx, ref in (("k_idx", k_idx, k_w), ("q_idx", q_idx, q_w)):
    check_array(name, idx)
    if idx.shape != ref.shape:
      raise ValueError(f"{name}: expected the shape of its weights {ref.shape}, got {idx.shape}")
    _check_indices(name, idx, dims["N"])
    if distinct_slots:
      _check_distinct(name, idx)
  starts = None
  if segment_ids is not None:
    segment_ids = check_segment_ids(segment_ids, dims)
    k_w, v, g, beta, q_w = mask_padding(segment_ids, (k_w, v, g, beta, q_w))
    starts = document_starts(segment_ids)
  B, T, H, _ = v.shape
  acc = jnp.result_type(jnp.float32, m0.dtype, k_w.dtype, v.dtype, g.dtype, beta.dtype, q_w.dtype)
  m0 = m0.astype(acc)
  if 0 in (B, T, H, dims["N"], dims["V"]):  # nothing to run: no token, or no entry to write or read
    return jnp.zeros(v.shape, v.dtype), _batch_table(m0, B) if output_final_state else None
  k_w, g, beta, q_w = (x.astype(acc) for x in (k_w, g, beta, q_w))
  o, final = implementation.run(m0, k_idx, k_w, v, g, beta, q_idx, q_w, starts, distinct_slots)
  return o.astype(v.dtype), final if output_final_state else None
