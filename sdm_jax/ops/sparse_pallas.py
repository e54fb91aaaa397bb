"""impl="pallas" of the Sparse Delta Memory recurrence: `pallas_kernels.sparse_tokens`, token by token.

The kernels move only the rows each token touches (W + R gathers and W writes per token and head, the
byte floor of the update), with no per-chunk algebra: at the H200 bench shape the chunked form's
coefficients and re-gathered rows cost more than the rows themselves (benchmarks/, 2026-11-30). Here XLA
forms the per-token weights the kernels need (a slot's summed weight within its token, its first entry),
and a custom_vjp saves the rows each token found before its write (T x W x V per head) for the backward
kernel, which undoes the writes in reverse.
"""

import jax
import jax.numpy as jnp

from pallas_kernels.sparse_tokens import sparse_tokens_bwd, sparse_tokens_fwd
from sdm_jax.ops.pallas import interpret, next_pow2

MIN_DIM = 16  # entries (W, R) and value columns are padded to powers of two >= 16


def _slot_groups(idx):
  """idx [..., W] -> (group [..., W], first [..., W] bool): entries of one token share a group iff they list
  the same slot; first marks the lowest-numbered entry of each group."""
  W = idx.shape[-1]
  group = jax.vmap(lambda i: jnp.searchsorted(jnp.sort(i), i))(idx.reshape(-1, W)).reshape(idx.shape)
  entry = jnp.broadcast_to(jnp.arange(W, dtype=group.dtype), idx.shape)
  lowest = jnp.full(idx.shape, W, group.dtype)
  lowest = jax.vmap(lambda l, g, e: l.at[g].min(e))(lowest.reshape(-1, W), group.reshape(-1, W),
                                                    entry.reshape(-1, W)).reshape(idx.shape)
  return group, jnp.take_along_axis(lowest, group, axis=-1) == entry


def _summed_within_token(idx, w):
  """w [..., W] summed over the entries of the same token that list the same slot (exact fp32 sums)."""
  W = idx.shape[-1]
  group, _ = _slot_groups(idx)
  flat = lambda x: x.reshape(-1, W)
  sums = jax.vmap(lambda g, x: jnp.zeros_like(x).at[g].add(x)[g])(flat(group), flat(w))
  return sums.reshape(w.shape)


def _heads(x):  # [B, T, H, ...] -> [B, H, T, ...], the kernels' layout
  return jnp.moveaxis(x, 2, 1)


def _tokens(x):  # [B, H, T, ...] -> [B, T, H, ...]
  return jnp.moveaxis(x, 1, 2)


def _forward_args(k_idx, k_w, v, g, beta, q_idx, q_w):
  """sparse_tokens_fwd's per-token arguments (after the table), in its [B, H, T, ...] layout."""
  k_slot = _summed_within_token(k_idx, k_w)
  return tuple(_heads(x) for x in (k_idx, k_w, k_slot, jnp.exp(g), beta, v, q_idx, q_w))


def _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, save):
  args = _forward_args(k_idx, k_w, v, g, beta, q_idx, q_w)
  final, o, *rows = sparse_tokens_fwd(table, *args, save_rows=save, interpret=interpret())
  if not save:
    return (_tokens(o), final), None
  return (_tokens(o), final), (final, rows[0], k_idx, k_w, v, g, beta, q_idx, q_w)


def _backward_args(residuals, d_o, d_final):
  """sparse_tokens_bwd's arguments from the forward's residuals and the cotangents of o and the final table."""
  final, rows, k_idx, k_w, v, g, beta, q_idx, q_w = residuals
  k_idx_h, k_w_h, k_slot, decay, beta_h, v_h, q_idx_h, _ = _forward_args(k_idx, k_w, v, g, beta, q_idx, q_w)
  k_first = _heads(_slot_groups(k_idx)[1].astype(jnp.float32))
  q_slot = _heads(_summed_within_token(q_idx, q_w))
  return (final, d_final, k_idx_h, k_w_h, k_slot, k_first, decay, beta_h, v_h, q_idx_h, q_slot, rows, _heads(d_o))


@jax.custom_vjp
def _sparse_delta_pallas(table, k_idx, k_w, v, g, beta, q_idx, q_w):
  return _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, save=False)[0]


def _fwd(table, k_idx, k_w, v, g, beta, q_idx, q_w):
  return _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, save=True)


def _bwd(residuals, cotangents):
  _, d_table, d_v, d_k_w, d_q_w, d_g, d_beta = sparse_tokens_bwd(*_backward_args(residuals, *cotangents),
                                                                 interpret=interpret())
  tile_sum = lambda x: _tokens(jnp.sum(x, axis=2))  # the kernel's per value tile partial sums
  v = residuals[4]
  return (d_table, None, tile_sum(d_k_w), _tokens(d_v).astype(v.dtype), tile_sum(d_g), tile_sum(d_beta), None,
          tile_sum(d_q_w))


_sparse_delta_pallas.defvjp(_fwd, _bwd)


def _pad_entries(idx, w):
  """Pads the last axis to a power of two >= 16 by repeating each token's first slot with weight 0: a slot
  listed twice is one slot with the summed weight, so the padding changes nothing."""
  extra = next_pow2(idx.shape[-1], MIN_DIM) - idx.shape[-1]
  if extra == 0:
    return idx, w
  rep = lambda x, fill: jnp.concatenate([x, jnp.broadcast_to(fill, (*x.shape[:-1], extra))], axis=-1)
  return rep(idx, idx[..., :1]), rep(w, jnp.zeros_like(w[..., :1]))


def sparse_delta_pallas(table, k_idx, k_w, v, g, beta, q_idx, q_w):
  """Same contract as `sparse_delta_chunk` without chunks (any T; fp32 table and floats)."""
  V = v.shape[-1]
  k_idx, k_w = _pad_entries(k_idx.astype(jnp.int32), k_w)
  q_idx, q_w = _pad_entries(q_idx.astype(jnp.int32), q_w)
  Vp = next_pow2(V, MIN_DIM)
  if Vp != V:  # zero value columns stay zero
    v = jnp.pad(v, [(0, 0)] * 3 + [(0, Vp - V)])
    table = jnp.pad(table, [(0, 0)] * 3 + [(0, Vp - V)])
  o, final = _sparse_delta_pallas(table, k_idx, k_w, v, g, beta, q_idx, q_w)
  return o[..., :V], final[..., :V]
