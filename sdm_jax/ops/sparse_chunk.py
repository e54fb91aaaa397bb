"""Chunked form of the sparse gated delta rule (SPEC.md section 3) with a memory-lean backward.

Sparse Delta Memory is GDN over N channels with a sparse key k_t (weights kappa_t on slots I_t,
duplicates summed), a decay exp(g_t) only on the key's support, and a sparse read key rho_t.
Within a chunk of C tokens every decay span is built from exactly the tokens it covers:
hit[t, w, j] says token j wrote the slot of entry (t, w), so the cumulative decay of that slot
from token s to token t is sum_{s < j <= t} g_j hit[t, w, j]. Slot interactions between tokens
come from index equality, so nothing of size N is formed except the table itself.

The backward keeps the rows each chunk overwrote (C x W x V per chunk, T x W x V in all), walks
the chunks in reverse, undoes each chunk's writes to recover its starting table and
differentiates that one chunk; its memory does not grow with T x N.
"""

import functools

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def _einsum(spec, *xs):
  return jnp.einsum(spec, *xs, precision=HIGHEST)


def chunk_step(table, k_idx, k_w, v, g, beta, q_idx, q_w):
  """One chunk for one (batch, head).

  table [N, V]; k_idx, k_w [C, W]; v [C, V]; g, beta [C]; q_idx, q_w [C, R].
  Returns (table at the chunk end, o [C, V]).
  """
  C = g.shape[0]
  dt = table.dtype
  j = jnp.arange(C)
  # hit[t, w, j]: token j wrote the slot of write entry (t, w); hit_q likewise for read entries.
  hit = jnp.any(k_idx[:, :, None, None] == k_idx[None, None, :, :], axis=-1)
  hit_q = jnp.any(q_idx[:, :, None, None] == k_idx[None, None, :, :], axis=-1)
  gh, gh_q = hit * g, hit_q * g  # [C, W or R, C]: the decay token j applies to that slot

  def span(gh, lo, hi):  # sum_j gh[t, w, j] over lo[t, s] < j <= hi[t, s] -> [C, W, C]
    mask = (j[None, None, :] > lo[:, :, None]) & (j[None, None, :] <= hi[:, :, None])  # [t, s, j]
    return _einsum("twj,tsj->tws", gh, mask.astype(dt))

  t_, s_ = jnp.meshgrid(j, j, indexing="ij")
  between = span(gh, s_, t_)  # decay of slot (t, w) from token s to t
  between_q = span(gh_q, s_, t_)
  from_start = jnp.sum(jnp.where(j[None, None, :] <= j[:, None, None], gh, 0.0), axis=-1)  # [C, W]
  from_start_q = jnp.sum(jnp.where(j[None, None, :] <= j[:, None, None], gh_q, 0.0), axis=-1)
  to_end = jnp.sum(jnp.where(j[None, None, :] > j[:, None, None], gh, 0.0), axis=-1)
  total = jnp.sum(gh, axis=-1)

  same = k_idx[:, :, None, None] == k_idx[None, None, :, :]  # [t, w, s, w']
  strict = (t_ > s_)[:, None, :]
  decay = jnp.where(strict, jnp.exp(jnp.where(strict, between, 0.0)), 0.0)  # [t, w, s]
  A = _einsum("tw,sx,twsx,tws->ts", k_w, k_w, same.astype(dt), decay)
  same_q = q_idx[:, :, None, None] == k_idx[None, None, :, :]
  causal = (t_ >= s_)[:, None, :]
  decay_q = jnp.where(causal, jnp.exp(jnp.where(causal, between_q, 0.0)), 0.0)
  A_qk = _einsum("tr,sx,trsx,trs->ts", q_w, k_w, same_q.astype(dt), decay_q)

  rows = table[k_idx]  # [C, W, V] chunk-start rows
  r0 = _einsum("tw,twv->tv", k_w * jnp.exp(from_start), rows)
  eye = jnp.eye(C, dtype=dt)
  delta = jax.lax.linalg.triangular_solve(eye + beta[:, None] * A, beta[:, None] * (v - r0), left_side=True,
                                          lower=True, unit_diagonal=True)  # d_t = beta_t (v_t - r_t)
  o = _einsum("tr,trv->tv", q_w * jnp.exp(from_start_q), table[q_idx]) + _einsum("ts,sv->tv", A_qk, delta)

  # Decay each touched slot once (duplicates write the same value), then add every write.
  table = table.at[k_idx].set(jnp.exp(total)[..., None] * rows)
  table = table.at[k_idx].add((k_w * jnp.exp(to_end))[..., None] * delta[:, None, :])
  return table, o


def _batched_step(table, floats, ints):
  k_w, v, g, beta, q_w = floats
  k_idx, q_idx = ints
  return jax.vmap(jax.vmap(chunk_step))(table, k_idx, k_w, v, g, beta, q_idx, q_w)  # over B, H


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
  gather = jax.vmap(jax.vmap(lambda m, i: m[i]))

  def step(table, xs):
    floats, ints = xs
    rows = gather(table, ints[0])  # the rows this chunk overwrites, kept for the backward
    table, o = _batched_step(table, floats, ints)
    return table, (o, rows)

  final, (o, saved_rows) = jax.lax.scan(step, table, (floats, ints))
  return (_from_chunks(o), final), (final, saved_rows, floats, ints)


def _bwd(chunk_size, residuals, cotangents):
  final, saved_rows, floats, ints = residuals
  d_o, d_final = cotangents
  restore = jax.vmap(jax.vmap(lambda m, i, r: m.at[i].set(r)))

  def step(carry, inputs):
    table_end, d_table = carry
    floats, ints, rows, d_o = inputs
    table_start = restore(table_end, ints[0], rows)  # undo this chunk's writes exactly
    _, vjp = jax.vjp(lambda t, f: _batched_step(t, f, ints), table_start, floats)
    d_start, d_floats = vjp((d_table, d_o))
    return (table_start, d_start), d_floats

  xs = (floats, ints, saved_rows, _to_chunks(d_o, chunk_size))
  (_, d_table), d_floats = jax.lax.scan(step, (final, d_final), xs, reverse=True)
  d_k_w, d_v, d_g, d_beta, d_q_w = (_from_chunks(d) for d in d_floats)
  return d_table, None, d_k_w, d_v, d_g, d_beta, None, d_q_w


sparse_delta_chunk.defvjp(_forward, _bwd)
