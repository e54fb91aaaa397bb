"""Chunked form of the sparse gated delta rule (SPEC.md section 3) with a memory-lean backward.

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
"""

import functools

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


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


def chunk_addressing(k_idx, k_w, g, beta, q_idx, q_w):
  """The value-independent part of one chunk for one (batch, head).

  k_idx, k_w [C, W]; g, beta [C]; q_idx, q_w [C, R]. Returns a dict of
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

  def span(gh, lo, hi):  # sum_j gh[t, w, j] over lo[t, s] < j <= hi[t, s] -> [C, W, C]
    mask = (j[None, None, :] > lo[:, :, None]) & (j[None, None, :] <= hi[:, :, None])  # [t, s, j]
    return _einsum("twj,tsj->tws", gh, mask.astype(dt))

  t_, s_ = jnp.meshgrid(j, j, indexing="ij")
  from_start = jnp.sum(jnp.where(j[None, None, :] <= j[:, None, None], gh, 0.0), axis=-1)  # [C, W]
  from_start_q = jnp.sum(jnp.where(j[None, None, :] <= j[:, None, None], gh_q, 0.0), axis=-1)
  to_end = jnp.sum(jnp.where(j[None, None, :] > j[:, None, None], gh, 0.0), axis=-1)
  total = jnp.sum(gh, axis=-1)

  strict = (t_ > s_)[:, None, :]
  decay = jnp.where(strict, jnp.exp(jnp.where(strict, span(gh, s_, t_), 0.0)), 0.0)  # [t, w, s]
  A = _einsum("tw,tws,tws->ts", k_w, weight, decay)
  causal = (t_ >= s_)[:, None, :]
  decay_q = jnp.where(causal, jnp.exp(jnp.where(causal, span(gh_q, s_, t_), 0.0)), 0.0)
  eye = jnp.eye(C, dtype=dt)
  return {
      "slots": u,
      "multiplicity": jnp.sum(counts, axis=-1)[u],  # group sizes
      "r0_coef": k_w * jnp.exp(from_start),
      "read_coef": q_w * jnp.exp(from_start_q),
      "solve": jax.lax.linalg.triangular_solve(eye + beta[:, None] * A, jnp.diag(beta), left_side=True, lower=True,
                                               unit_diagonal=True),
      "A_qk": _einsum("tr,trs,trs->ts", q_w, weight_q, decay_q),
      "keep": jnp.exp(total),
      "write_coef": k_w * jnp.exp(to_end),
  }


def chunk_rows(rows_k, rows_q, k_idx, k_w, v, g, beta, q_idx, q_w):
  """One chunk for one (batch, head), on the table rows it touches.

  rows_k [C, W, V], rows_q [C, R, V]: the chunk-start rows at k_idx, q_idx; k_idx, k_w [C, W];
  v [C, V]; g, beta [C]; q_idx, q_w [C, R].
  Returns ((kept [C, W, V], written [C, W, V], o [C, V]), multiplicity [C, W]): at the chunk end,
  slot k_idx[t, w] holds kept[t, w] (the same for every entry of that slot) plus the sum of written
  over its entries; multiplicity[t, w] counts those entries (>= 1).
  """
  a = chunk_addressing(k_idx, k_w, g, beta, q_idx, q_w)
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
