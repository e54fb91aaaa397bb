"""impl="pallas" of the Sparse Delta Memory recurrence: `pallas_kernels.sparse_delta` for the forward,
`pallas_kernels.sparse_delta_bwd` for the backward.

The value-independent algebra of every chunk comes from `chunk_addressing` (XLA, a few chunks at a
time); the kernels gather, multiply and write the table rows. The forward keeps the rows each chunk
overwrote and the chunks' coefficients (C x (6 W + R + 2 C) per chunk and head, small next to the rows);
the backward kernel walks the chunks in reverse on them and returns the coefficients' cotangents,
which `jax.vjp` of `chunk_addressing` (again a few chunks at a time) takes back to k_w, g, beta, q_w.
"""

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.sparse_delta import sparse_delta_fwd
from pallas_kernels.sparse_delta_bwd import sparse_delta_bwd
from sdm_jax.ops.pallas import interpret, next_pow2
from sdm_jax.ops.sparse_chunk import _from_chunks, _split, _to_chunks, chunk_addressing, first_writes, per_token

PALLAS_SPARSE_CHUNK_SIZES = (16, 32, 64)
MIN_DIM = 16  # the kernel's dots need every dim >= 16
# Chunks whose coefficients are formed at once. Slot matching is O(C x W x C) per chunk and head, but the
# temporaries (slot tables, decay spans) still grow with the batch: at the H200 bench shape (4x4096, H=2,
# W=R=128, C=64) XLA reports 2.6 GiB at 16 and 9.2 GiB for all 64 chunks, against 1.2 GiB of coefficients.
CHUNKS_PER_BATCH = 16
# The coefficients that depend on the float inputs, in the order the backward returns their cotangents.
DIFFERENTIABLE = ("r0_coef", "read_coef", "solve", "A_qk", "keep", "write_coef")


def _summed_within_token(idx, coef):
  """[C, W] coef summed over the entries of the same token that list the same slot (idx [C, W])."""
  def token(idx, coef):
    group = jnp.searchsorted(jnp.sort(idx), idx)  # the slot's first position among the token's sorted slots
    return jnp.zeros_like(coef).at[group].add(coef)[group]

  return jax.vmap(token)(idx, coef)


def _chunk_coefficients(k_idx, k_w, g, beta, q_idx, q_w):
  """The kernels' per-chunk coefficients for one (batch, head) (shapes as in `chunk_addressing`): the
  forward's (r0_coef, read_coef, solve, A_qk, keep, slot_write, first) and the backward's extras
  (write_coef, multiplicity, slot_r0_coef, slot_read_coef)."""
  a = chunk_addressing(k_idx, k_w, g, beta, q_idx, q_w)
  u = a["slots"]
  # slot_write[t, w, s]: token s's summed write_coef on the slot of (t, w). first[t, w]: no earlier token
  # wrote this slot in the chunk, so the table still holds its chunk-start row when token t writes it
  # (duplicates within token t compute, and write, the same value).
  slot_write = per_token(u, a["write_coef"])[u]
  first = first_writes(u).astype(k_w.dtype)
  forward = (a["r0_coef"], a["read_coef"], a["solve"], a["A_qk"], a["keep"], slot_write, first)
  backward = (a["write_coef"], a["multiplicity"], _summed_within_token(k_idx, a["r0_coef"]),
              _summed_within_token(q_idx, a["read_coef"]))
  return forward, backward


def _over_chunks(fn, xs):
  """fn of one chunk and (batch, head), mapped over [Nc, B, H, ...] inputs a few chunks at a time."""
  return jax.lax.map(lambda xs: jax.vmap(jax.vmap(fn))(*xs), xs, batch_size=CHUNKS_PER_BATCH)


def _heads_first(x):  # [Nc, B, H, ...] -> [B, H, Nc, ...], the kernels' layout
  return jnp.moveaxis(x, 0, 2)


def _chunks_first(x):  # [B, H, Nc, ...] -> [Nc, B, H, ...]
  return jnp.moveaxis(x, 2, 0)


def kernel_inputs(k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size):
  """(the forward kernel's arguments after the table, the backward's extra coefficients, floats, ints): the
  chunks' coefficients from XLA, in the kernels' [B, H, Nc, ...] layout."""
  floats, ints = _split(k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size)
  k_w, v, g, beta, q_w = floats
  forward, backward = _over_chunks(_chunk_coefficients, (ints[0], k_w, g, beta, ints[1], q_w))
  k_idx, q_idx = (_heads_first(x.astype(jnp.int32)) for x in ints)
  args = (k_idx, q_idx, *(_heads_first(x) for x in forward), _heads_first(v))
  return args, backward, floats, ints


def _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size, save):
  """(o, final table) and, with save, the backward's residuals (the kernel then also writes the rows)."""
  args, backward, floats, ints = kernel_inputs(k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size)
  final, o, *rows = sparse_delta_fwd(table, *args, save_rows=save, interpret=interpret())
  o = _from_chunks(_chunks_first(o))
  if not save:
    return (o, final), None
  k_idx, q_idx, r0_coef, read_coef, solve, a_qk, keep, slot_write, first, v = args
  write_coef, multiplicity, slot_r0_coef, slot_read_coef = backward
  write_coef, slot_r0_coef, slot_read_coef = (_heads_first(x) for x in (write_coef, slot_r0_coef, slot_read_coef))
  kernel_args = (k_idx, q_idx, r0_coef, solve, a_qk, keep, first, write_coef, slot_r0_coef, slot_read_coef, rows[0],
                 v)
  return (o, final), (final, kernel_args, multiplicity, floats, ints)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _sparse_delta_pallas(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size):
  return _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size, save=False)[0]


def _fwd(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size):
  return _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size, save=True)


def _coefficients_vjp(k_idx, k_w, g, beta, q_idx, q_w, d_coefficients):
  """One chunk and (batch, head): the coefficients' cotangents -> (d_k_w, d_g, d_beta, d_q_w)."""
  def coefficients(k_w, g, beta, q_w):
    a = chunk_addressing(k_idx, k_w, g, beta, q_idx, q_w)
    return tuple(a[name] for name in DIFFERENTIABLE)

  return jax.vjp(coefficients, k_w, g, beta, q_w)[1](d_coefficients)


def _bwd(chunk_size, residuals, cotangents):
  final, kernel_args, multiplicity, floats, ints = residuals
  d_o, d_final = cotangents
  k_w, v, g, beta, q_w = floats
  k_idx, q_idx = ints
  d_o = _heads_first(_to_chunks(d_o, chunk_size))
  _, d_table, d_v, *d_tiles = sparse_delta_bwd(final, d_final, *kernel_args, d_o,
                                               interpret=interpret())
  d_r0_coef, d_read_coef, d_solve, d_aqk, d_keep, d_write_coef = (_chunks_first(jnp.sum(d, axis=2)) for d in d_tiles)
  # Every entry of a slot sets the same kept value: the slot's cotangent is shared among them.
  d_keep = d_keep / multiplicity.astype(d_keep.dtype)
  d_coefficients = (d_r0_coef, d_read_coef, d_solve, d_aqk, d_keep, d_write_coef)
  d_k_w, d_g, d_beta, d_q_w = _over_chunks(_coefficients_vjp, (k_idx, k_w, g, beta, q_idx, q_w, d_coefficients))
  d_v = _from_chunks(_chunks_first(d_v)).astype(v.dtype)
  d_k_w, d_g, d_beta, d_q_w = (_from_chunks(d) for d in (d_k_w, d_g, d_beta, d_q_w))
  return d_table, None, d_k_w, d_v, d_g, d_beta, None, d_q_w


_sparse_delta_pallas.defvjp(_fwd, _bwd)


def _pad_entries(idx, w):
  """Pads the last axis to >= 16 entries by repeating each token's first slot with weight 0: a slot
  listed twice is one slot with the summed weight, so the padding changes nothing."""
  extra = MIN_DIM - idx.shape[-1]
  if extra <= 0:
    return idx, w
  rep = lambda x, fill: jnp.concatenate([x, jnp.broadcast_to(fill, (*x.shape[:-1], extra))], axis=-1)
  return rep(idx, idx[..., :1]), rep(w, jnp.zeros_like(w[..., :1]))


def sparse_delta_pallas(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size):
  """Same contract as `sparse_delta_chunk` (T a multiple of chunk_size, fp32 table and floats)."""
  if chunk_size not in PALLAS_SPARSE_CHUNK_SIZES:
    raise ValueError(f"chunk_size: sparse impl='pallas' supports {PALLAS_SPARSE_CHUNK_SIZES}, got {chunk_size}")
  k_idx, k_w = _pad_entries(k_idx, k_w)
  q_idx, q_w = _pad_entries(q_idx, q_w)
  V = v.shape[-1]
  Vp = next_pow2(V, MIN_DIM)
  if Vp != V:  # zero value columns stay zero
    v = jnp.pad(v, [(0, 0)] * 3 + [(0, Vp - V)])
    table = jnp.pad(table, [(0, 0)] * 3 + [(0, Vp - V)])
  o, final = _sparse_delta_pallas(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size)
  return o[..., :V], final[..., :V]
