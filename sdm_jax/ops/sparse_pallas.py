"""impl="pallas" of the Sparse Delta Memory recurrence: `pallas_kernels.sparse_delta` for the forward.

The value-independent algebra of every chunk comes from `chunk_addressing` (XLA, a few chunks at a
time); the kernel gathers, multiplies and writes the table rows. The backward is the chunk impl's
memory-lean backward (`sparse_chunk._bwd`) on the rows the kernel saved.
"""

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.sparse_delta import sparse_delta_fwd
from sdm_jax.ops.pallas import next_pow2
from sdm_jax.ops.sparse_chunk import _bwd, _from_chunks, _split, chunk_addressing, first_writes, per_token

PALLAS_SPARSE_CHUNK_SIZES = (16, 32, 64)
MIN_DIM = 16  # the kernel's dots need every dim >= 16
# Chunks whose coefficients are formed at once. Slot matching is O(C x W x C) per chunk and head, but the
# temporaries (slot tables, decay spans) still grow with the batch: at the H200 bench shape (4x4096, H=2,
# W=R=128, C=64) XLA reports 2.6 GiB at 16 and 9.2 GiB for all 64 chunks, against 1.2 GiB of coefficients.
CHUNKS_PER_BATCH = 16


def _chunk_coefficients(k_idx, k_w, g, beta, q_idx, q_w):
  """The kernel's per-chunk coefficients for one (batch, head) (shapes as in `chunk_addressing`)."""
  a = chunk_addressing(k_idx, k_w, g, beta, q_idx, q_w)
  u = a["slots"]
  # slot_write[t, w, s]: token s's summed write_coef on the slot of (t, w). first[t, w]: no earlier token
  # wrote this slot in the chunk, so the table still holds its chunk-start row when token t writes it
  # (duplicates within token t compute, and write, the same value).
  slot_write = per_token(u, a["write_coef"])[u]
  first = first_writes(u).astype(k_w.dtype)
  return a["r0_coef"], a["read_coef"], a["solve"], a["A_qk"], a["keep"], slot_write, first


def _kernel_inputs(k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size):
  """Chunked [B, H, Nc, C, ...] inputs of the kernel and the chunk impl's (floats, ints) for the backward."""
  floats, ints = _split(k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size)
  k_w, v, g, beta, q_w = floats
  k_idx, q_idx = ints
  per_chunk = jax.vmap(jax.vmap(_chunk_coefficients))  # over B, H
  coefficients = jax.lax.map(lambda xs: per_chunk(*xs), (k_idx, k_w, g, beta, q_idx, q_w),
                             batch_size=CHUNKS_PER_BATCH)
  heads_first = lambda x: jnp.moveaxis(x, 0, 2)  # [Nc, B, H, ...] -> [B, H, Nc, ...]
  kernel_args = [heads_first(x) for x in (k_idx.astype(jnp.int32), q_idx.astype(jnp.int32), *coefficients, v)]
  return kernel_args, (floats, ints)


def _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size, save):
  """(o, final table) and, with save, the backward's residuals (the kernel then also writes the rows)."""
  kernel_args, (floats, ints) = _kernel_inputs(k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size)
  final, o, *rows = sparse_delta_fwd(table, *kernel_args, save_rows=save, interpret=jax.default_backend() != "gpu")
  o = _from_chunks(jnp.moveaxis(o, 2, 0))
  return (o, final), ((final, jnp.moveaxis(rows[0], 2, 0), floats, ints) if save else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _sparse_delta_pallas(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size):
  return _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size, save=False)[0]


def _fwd(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size):
  return _forward(table, k_idx, k_w, v, g, beta, q_idx, q_w, chunk_size, save=True)


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
