"""Chunked form of the sparse gated delta rule (DESIGN.md section 3) with a memory-lean backward.

Sparse Delta Memory is GDN over N channels with a sparse key k_t (weights kappa_t on slots I_t,
duplicates summed), a decay exp(g_t) only on the key's support, and a sparse read key rho_t.
Within a chunk of C tokens every decay span is built from exactly the tokens it covers:
hit[t, w, j] says token j wrote the slot of entry (t, w), so the cumulative decay of that slot
from token s to token t is sum_{s < j <= t} g_j hit[t, w, j]. Slot interactions between tokens
come from chunk-local slot ids (`slot_groups`: entries share an id iff they share a slot) and
per-token tables over those ids ([C x W, C]), so nothing of size N is formed except the table
itself, and no entry is compared with every other (no C x W x C x W tensor).

The backward keeps the rows each chunk overwrote (C x W x V per chunk, T x W x V in all), walks
the chunks in reverse, undoes each chunk's writes to recover its starting table and
differentiates that one chunk on its touched rows only: the table cotangent is updated in place
at those rows, so neither its memory nor its work grows with T x N.

Packed documents (`sparse_delta_chunk_packed`, DESIGN.md section 9): every document starts from m0. Runs (a document
and the padding after it) are numbered along the row, and the table carries beside each slot the run that last
wrote it (version [B, H, N] int32): a token reads a slot's row from the table when its own run wrote it last, else
from m0, so no document ever has to put m0 back on what the one before it wrote (nothing of size N per document).
Within a chunk, token pairs of different documents do not interact and decay spans stop at a document start
(`chunk_addressing` with doc); only the chunk's last document's writes reach the table and the versions. The
final table is m0 wherever the last run did not write (once per call).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from sdm_jax.ops.segments import chunk_documents
from sdm_jax.ops.validation import check_chunk_size

HIGHEST = jax.lax.Precision.HIGHEST
CHUNK_SIZE = 16  # tokens per chunk when the op is not told; the results do not depend on it


@dataclasses.dataclass(frozen=True)
class ChunkConfig:
  """What impl="chunk" runs with: chunk_size tokens per chunk (a power of two; the op clamps it to T's padded
  length, `validation.chunk_size_for`). ValueError naming chunk_size otherwise."""
  chunk_size: int = CHUNK_SIZE

  def __post_init__(self):
    check_chunk_size(self.chunk_size)


def _einsum(spec, *xs):
  return jnp.einsum(spec, *xs, precision=HIGHEST)


def slot_groups(k_idx, q_idx):
  """Chunk-local slot ids, so that slot matching never compares every pair of entries.

  k_idx [C, W], q_idx [C, R] (one chunk, one batch-head). Returns u [C, W] and u_q [C, R], int32:
  u[t, w] is the position of the slot k_idx[t, w] in the sorted write slots of the chunk (its first
  occurrence there), so two write entries share an id iff they share a slot; u_q[t, r] is that id
  for q_idx[t, r] when some write entry of the chunk has that slot, else C * W (a sentinel whose
  row in `per_token` is zero). Ids lie in [0, C * W], not densely.
  """
  slots = jnp.sort(k_idx.reshape(-1))
  u = jnp.searchsorted(slots, k_idx, side="left").astype(jnp.int32)
  pos = jnp.searchsorted(slots, q_idx, side="left").astype(jnp.int32)
  found = slots[jnp.minimum(pos, slots.shape[0] - 1)] == q_idx
  return u, jnp.where(found, pos, slots.shape[0])


def per_token(u, x):
  """x [C, W] over the write entries -> [C * W + 1, C]: row g, column s sums x[s, w] over token s's
  entries in group g (a scatter-add; rows of unused ids and the sentinel's stay 0). Gathering it at
  u [C, W] (or u_q) gives [t, w, s]: token s's summed x on the slot of entry (t, w)."""
  C, W = u.shape
  s = jnp.broadcast_to(jnp.arange(C)[:, None], u.shape)
  return jnp.zeros((C * W + 1, C), x.dtype).at[u, s].add(x)


def chunk_addressing(k_idx, k_w, g, beta, q_idx, q_w, doc=None):
  """The value-independent part of one chunk for one (batch, head).

  k_idx, k_w [C, W]; g, beta [C]; q_idx, q_w [C, R]; doc: None or [C] int, packed documents: the number of
  document starts at or before each token inside the chunk (`segments.chunk_documents`), tokens of different
  documents then do not interact, the chunk-start rows are each document's own (m0 for one that starts inside),
  and keep, write_coef and multiplicity concern the chunk's last document, the only one its writes leave (commit
  [C, W] bool marks its entries; multiplicity is 0 elsewhere). Returns a dict of
    slots [C, W]: the entries' chunk-local slot ids (`slot_groups`)
    multiplicity [C, W]: how many write entries of the chunk share the slot of (t, w) (>= 1)
    r0_coef [C, W]: r0_t = sum_w r0_coef[t, w] * (chunk-start row of slot k_idx[t, w])
    read_coef [C, R]: the chunk-start rows' part of o_t, likewise over q_idx
    solve [C, C]: Delta = solve @ (V - r0), i.e. (I + diag(beta) A)^-1 diag(beta)
    A_qk [C, C]: o = (read part) + A_qk Delta
    keep [C, W]: exp(total decay of the slot over the chunk)
    write_coef [C, W]: entry (t, w) adds write_coef[t, w] * Delta_t to its slot.
  """
  C = g.shape[0]
  dt = k_w.dtype
  j = jnp.arange(C)
  # hit[t, w, s]: token s wrote the slot of entry (t, w); weight[t, w, s]: token s's summed write
  # weight on that slot. Both are per-token tables of the chunk's slot groups gathered at the ids.
  u, u_q = slot_groups(k_idx, q_idx)
  counts = per_token(u, jnp.ones(u.shape, jnp.int32))
  weights = per_token(u, k_w)
  hit, hit_q = counts[u] > 0, counts[u_q] > 0
  weight, weight_q = weights[u], weights[u_q]
  gh, gh_q = hit * g, hit_q * g  # [C, W or R, C]: the decay token j applies to that slot
  if doc is not None:  # decays only from tokens of the same document
    same = doc[:, None] == doc[None, :]  # [t, s]
    gh, gh_q = gh * same[:, None, :], gh_q * same[:, None, :]
    commit = jnp.broadcast_to((doc == doc[-1])[:, None], u.shape)

  def span(gh, lo, hi):  # sum_j gh[t, w, j] over lo[t, s] < j <= hi[t, s] -> [C, W, C]
    mask = (j[None, None, :] > lo[:, :, None]) & (j[None, None, :] <= hi[:, :, None])  # [t, s, j]
    return _einsum("twj,tsj->tws", gh, mask.astype(dt))

  t_, s_ = jnp.meshgrid(j, j, indexing="ij")
  pair = (lambda m: m) if doc is None else (lambda m: m & same)
  from_start = jnp.sum(jnp.where(j[None, None, :] <= j[:, None, None], gh, 0.0), axis=-1)  # [C, W]
  from_start_q = jnp.sum(jnp.where(j[None, None, :] <= j[:, None, None], gh_q, 0.0), axis=-1)
  to_end = jnp.sum(jnp.where(j[None, None, :] > j[:, None, None], gh, 0.0), axis=-1)
  total = jnp.sum(gh, axis=-1)

  strict = pair(t_ > s_)[:, None, :]
  decay = jnp.where(strict, jnp.exp(jnp.where(strict, span(gh, s_, t_), 0.0)), 0.0)  # [t, w, s]
  A = _einsum("tw,tws,tws->ts", k_w, weight, decay)
  causal = pair(t_ >= s_)[:, None, :]
  decay_q = jnp.where(causal, jnp.exp(jnp.where(causal, span(gh_q, s_, t_), 0.0)), 0.0)
  eye = jnp.eye(C, dtype=dt)
  multiplicity = jnp.sum(counts, axis=-1)[u]  # group sizes
  if doc is not None:
    multiplicity = jnp.sum(per_token(u, commit.astype(jnp.int32)), axis=-1)[u] * commit
  extra = {} if doc is None else {"commit": commit}
  return {
      **extra,
      "slots": u,
      "multiplicity": multiplicity,
      "r0_coef": k_w * jnp.exp(from_start),
      "read_coef": q_w * jnp.exp(from_start_q),
      "solve": jax.lax.linalg.triangular_solve(eye + beta[:, None] * A, jnp.diag(beta), left_side=True, lower=True,
                                               unit_diagonal=True),
      "A_qk": _einsum("tr,trs,trs->ts", q_w, weight_q, decay_q),
      "keep": jnp.exp(total),
      "write_coef": k_w * jnp.exp(to_end),
  }


def chunk_rows(rows_k, rows_q, k_idx, k_w, v, g, beta, q_idx, q_w, doc=None):
  """One chunk for one (batch, head), on the table rows it touches.

  rows_k [C, W, V], rows_q [C, R, V]: the chunk-start rows at k_idx, q_idx; k_idx, k_w [C, W];
  v [C, V]; g, beta [C]; q_idx, q_w [C, R]; doc: None or [C] (`chunk_addressing`; the rows are then each
  token's document's own).
  Returns ((kept [C, W, V], written [C, W, V], o [C, V]), multiplicity [C, W]): at the chunk end,
  slot k_idx[t, w] holds kept[t, w] (the same for every entry of that slot) plus the sum of written
  over its entries; multiplicity[t, w] counts those entries (>= 1; packed, the last document's entries only, 0
  for the others, whose kept and written are not stored).
  """
  a = chunk_addressing(k_idx, k_w, g, beta, q_idx, q_w, doc)
  r0 = _einsum("tw,twv->tv", a["r0_coef"], rows_k)
  delta = _einsum("ts,sv->tv", a["solve"], v - r0)  # d_t = beta_t (v_t - r_t)
  o = _einsum("tr,trv->tv", a["read_coef"], rows_q) + _einsum("ts,sv->tv", a["A_qk"], delta)
  # Each touched slot decays once over the chunk (its entries agree), then every write adds.
  kept = a["keep"][..., None] * rows_k
  written = a["write_coef"][..., None] * delta[:, None, :]
  return (kept, written, o), a["multiplicity"]


def _rows_step(rows_k, rows_q, floats, ints):
  k_w, v, g, beta, q_w = floats
  k_idx, q_idx = ints
  return jax.vmap(jax.vmap(chunk_rows))(rows_k, rows_q, k_idx, k_w, v, g, beta, q_idx, q_w)  # over B, H


# Per (batch, head) row gathers and in-place row updates of the [B, H, N, V] table.
_gather = jax.vmap(jax.vmap(lambda m, i: m[i]))
_set = jax.vmap(jax.vmap(lambda m, i, r: m.at[i].set(r)))
_add = jax.vmap(jax.vmap(lambda m, i, r: m.at[i].add(r)))


def _read_before_write(rows, table):
  """Orders a gather from the table before the table's in-place row updates.

  Without it XLA may not prove the order and copies the whole [B, H, N, V] table every chunk.
  """
  return jax.lax.optimization_barrier((rows, table))


def _to_chunks(x, C):  # [B, T, H, ...] -> [N, B, H, C, ...] (T a multiple of C)
  B, T, H = x.shape[:3]
  x = x.reshape(B, T // C, C, H, *x.shape[3:])
  return jnp.moveaxis(jnp.moveaxis(x, 1, 0), 3, 2)


def _from_chunks(x):  # [N, B, H, C, ...] -> [B, N * C, H, ...]
  N, B, H, C = x.shape[:4]
  return jnp.moveaxis(jnp.moveaxis(x, 2, 3), 0, 1).reshape(B, N * C, H, *x.shape[4:])


def _split(k_idx, k_w, v, g, beta, q_idx, q_w, C):
  floats = tuple(_to_chunks(x, C) for x in (k_w, v, g, beta, q_w))
  ints = tuple(_to_chunks(x, C) for x in (k_idx, q_idx))
  return floats, ints


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def sparse_delta_chunk(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size):
  """table [B, H, N, V]; k_idx, k_w [B, T, H, W]; v [B, T, H, V]; g, beta [B, T, H];
  q_idx, q_w [B, T, H, R]; T a multiple of chunk_size. Returns (o [B, T, H, V], final table)."""
  return _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size)[0]


def _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size):
  floats, ints = _split(k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size)

  def step(table, xs):
    floats, ints = xs
    rows_k = _gather(table, ints[0])  # the rows this chunk overwrites, kept for the backward
    rows_q, table = _read_before_write(_gather(table, ints[1]), table)
    (kept, written, o), _ = _rows_step(rows_k, rows_q, floats, ints)
    return _add(_set(table, ints[0], kept), ints[0], written), (o, rows_k)

  final, (o, saved_rows) = jax.lax.scan(step, table, (floats, ints))
  return (_from_chunks(o), final), (final, saved_rows, floats, ints)


def _bwd(chunk_size, residuals, cotangents):
  """Walks the chunks in reverse; the table cotangent changes only at the rows a chunk touches."""
  final, saved_rows, floats, ints = residuals
  d_o, d_final = cotangents

  def step(carry, inputs):
    table_end, d_end = carry
    floats, ints, rows_k, d_o = inputs
    k_idx, q_idx = ints
    table_start = _set(table_end, k_idx, rows_k)  # undo this chunk's writes exactly
    rows_q, table_start = _read_before_write(_gather(table_start, q_idx), table_start)
    _, vjp, multiplicity = jax.vjp(lambda rk, rq, f: _rows_step(rk, rq, f, ints), rows_k, rows_q, floats,
                                   has_aux=True)
    d_slot, d_end = _read_before_write(_gather(d_end, k_idx), d_end)
    # Every entry of a slot sets the same kept value: the slot's cotangent is shared among them.
    d_kept = d_slot / multiplicity[..., None].astype(d_slot.dtype)
    d_rows_k, d_rows_q, d_floats = vjp((d_kept, d_slot, d_o))
    d_start = _add(_add(_set(d_end, k_idx, jnp.zeros_like(d_slot)), k_idx, d_rows_k), q_idx, d_rows_q)
    return (table_start, d_start), d_floats

  xs = (floats, ints, saved_rows, _to_chunks(d_o, chunk_size))
  (_, d_table), d_floats = jax.lax.scan(step, (final, d_final), xs, reverse=True)
  d_k_w, d_v, d_g, d_beta, d_q_w = (_from_chunks(d) for d in d_floats)
  return d_table, None, d_k_w, d_v, d_g, d_beta, None, d_q_w


sparse_delta_chunk.defvjp(_forward, _bwd)


# Packed documents. Per (batch, head) gathers from m0 ([H, N, V] shared: the head's table for every row), and the
# version gathers and updates; an index N drops an update (the entries of a chunk's earlier documents).
_gather_shared = jax.vmap(jax.vmap(lambda m, i: m[i]), in_axes=(None, 0))
_set_kept = jax.vmap(jax.vmap(lambda m, i, r: m.at[i].set(r, mode="drop")))
_add_kept = jax.vmap(jax.vmap(lambda m, i, r: m.at[i].add(r, mode="drop")))


def _gather_m0(m0, idx):
  return (_gather_shared if m0.ndim == 3 else _gather)(m0, idx)


def _rows_step_packed(rows_k, rows_q, floats, ints, doc):
  k_w, v, g, beta, q_w = floats
  k_idx, q_idx = ints
  per_row = jax.vmap(chunk_rows, in_axes=(0,) * 9 + (None,))  # the heads share the documents
  return jax.vmap(per_row)(rows_k, rows_q, k_idx, k_w, v, g, beta, q_idx, q_w, doc)


def _documents(starts, C):
  """starts [B, T] bool -> per chunk [n, B, C] int32: doc (`segments.chunk_documents`), run (the run of each token
  along its row: runs begin at t = 0 and at every document start)."""
  B, T = starts.shape
  doc = chunk_documents(starts, C)
  run = jnp.cumsum(starts.astype(jnp.int32), axis=1)
  to_chunks = lambda x: jnp.moveaxis(x.reshape(B, T // C, C), 1, 0)
  return to_chunks(doc), to_chunks(run)


def _own_rows(rows, found_run, m0_rows, run):
  """The rows a token starts from: the table's where its run wrote them last, else m0's. rows, m0_rows
  [B, H, C, E, V]; found_run [B, H, C, E]; run [B, C]."""
  own = found_run == run[:, None, :, None]
  return jnp.where(own[..., None], rows, m0_rows), own


def _committed(k_idx, doc, N):
  """k_idx [B, H, C, W] where the entry belongs to the chunk's last document (doc [B, C]), else N."""
  last = (doc == doc[:, -1:])[:, None, :, None]
  return jnp.where(last, k_idx, N)


@functools.partial(jax.custom_vjp, nondiff_argnums=(9,))
def sparse_delta_chunk_packed(m0, k_idx, k_w, v, g, beta, q_idx, q_w, starts, chunk_size):
  """`sparse_delta_chunk` for packed documents (padding masked by the caller). m0 [H, N, V] or [B, H, N, V];
  starts [B, T] bool, where documents start (`segments.document_starts`); T a multiple of chunk_size. Returns
  (o [B, T, H, V], final table [B, H, N, V]: the last document's, m0 where it did not write)."""
  return _forward_packed(m0, k_idx, k_w, v, g, beta, q_idx, q_w, starts, chunk_size)[0]


def _forward_packed(m0, k_idx, k_w, v, g, beta, q_idx, q_w, starts, chunk_size):
  B, T, H, _ = v.shape
  N = m0.shape[-2]
  floats, ints = _split(k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size)
  docs = _documents(starts, chunk_size)
  m0_rows = jnp.broadcast_to(m0, (B, *m0.shape[-3:]))

  def step(carry, xs):
    table, version = carry
    floats, ints, (doc, run) = xs
    k_idx, q_idx = ints
    found_k, found_run = _gather(table, k_idx), _gather(version, k_idx)  # kept for the backward
    found_q, found_run_q, table, version = jax.lax.optimization_barrier(
        (_gather(table, q_idx), _gather(version, q_idx), table, version))  # as `_read_before_write`
    rows_k, _ = _own_rows(found_k, found_run, _gather_m0(m0, k_idx), run)
    rows_q, _ = _own_rows(found_q, found_run_q, _gather_m0(m0, q_idx), run)
    (kept, written, o), _ = _rows_step_packed(rows_k, rows_q, floats, ints, doc)
    slots = _committed(k_idx, doc, N)
    table = _add_kept(_set_kept(table, slots, kept), slots, written)
    version = _set_kept(version, slots, jnp.broadcast_to(run[:, None, -1:, None], slots.shape))
    return (table, version), (o, found_k, found_run)

  start = (m0_rows, jnp.zeros((B, H, N), jnp.int32))
  (table, version), (o, found_k, found_run) = jax.lax.scan(step, start, (floats, ints, docs))
  last = (version == docs[1][-1, :, -1][:, None, None])[..., None]  # the slots the last run wrote
  final = jnp.where(last, table, m0_rows)
  return (_from_chunks(o), final), (m0, table, version, found_k, found_run, floats, ints, docs)


def _bwd_packed(chunk_size, residuals, cotangents):
  """As `_bwd`, with the versions undone beside the rows; a row a token read from m0 sends its cotangent to dM0."""
  m0, table, version, found_k, found_run, floats, ints, docs = residuals
  d_o, d_final = cotangents
  B = d_o.shape[0]
  N = m0.shape[-2]
  last = (version == docs[1][-1, :, -1][:, None, None])[..., None]
  zero = jnp.zeros((), d_final.dtype)
  d_table, d_m0 = jnp.where(last, d_final, zero), jnp.where(last, zero, d_final)

  def step(carry, inputs):
    table_end, version_end, d_end, d_m0 = carry
    floats, ints, found_k, found_run, (doc, run), d_o = inputs
    k_idx, q_idx = ints
    rows_k, own_k = _own_rows(found_k, found_run, _gather_m0(m0, k_idx), run)
    # The chunk's last document's entries are the ones it stored: undo those (rows and versions).
    slots = _committed(k_idx, doc, N)
    table_start = _set_kept(table_end, slots, found_k)
    version_start = _set_kept(version_end, slots, found_run)
    found_q, found_run_q, table_start, version_start = jax.lax.optimization_barrier(
        (_gather(table_start, q_idx), _gather(version_start, q_idx), table_start, version_start))
    rows_q, own_q = _own_rows(found_q, found_run_q, _gather_m0(m0, q_idx), run)
    _, vjp, multiplicity = jax.vjp(lambda rk, rq, f: _rows_step_packed(rk, rq, f, ints, doc), rows_k, rows_q, floats,
                                   has_aux=True)
    d_slot, d_end = _read_before_write(_gather(d_end, k_idx), d_end)
    stored = (multiplicity > 0)[..., None]
    d_slot = jnp.where(stored, d_slot, 0.0)
    d_kept = d_slot / jnp.maximum(multiplicity, 1)[..., None].astype(d_slot.dtype)
    d_rows_k, d_rows_q, d_floats = vjp((d_kept, d_slot, d_o))
    to_table = lambda d, own: jnp.where(own[..., None], d, 0.0)
    to_m0 = lambda d, own: jnp.where(own[..., None], 0.0, d)
    d_start = _add(_add(_set_kept(d_end, slots, jnp.zeros_like(d_slot)), k_idx, to_table(d_rows_k, own_k)), q_idx,
                   to_table(d_rows_q, own_q))
    d_m0 = _add(_add(d_m0, k_idx, to_m0(d_rows_k, own_k)), q_idx, to_m0(d_rows_q, own_q))
    return (table_start, version_start, d_start, d_m0), d_floats

  xs = (floats, ints, found_k, found_run, docs, _to_chunks(d_o, chunk_size))
  (_, _, d_table, d_m0), d_floats = jax.lax.scan(step, (table, version, d_table, d_m0), xs, reverse=True)
  d_m0 = d_m0 + d_table  # what reached t = 0: the first run's table is m0
  if m0.ndim == 3:
    d_m0 = jnp.sum(d_m0, axis=0)
  d_k_w, d_v, d_g, d_beta, d_q_w = (_from_chunks(d) for d in d_floats)
  return d_m0, None, d_k_w, d_v, d_g, d_beta, None, d_q_w, None


sparse_delta_chunk_packed.defvjp(_forward_packed, _bwd_packed)
