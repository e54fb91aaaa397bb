"""Packed sequences (DESIGN.md section 9): documents packed into the rows of a batch, marked by segment ids.

segment_ids [B, T] int: contiguous tokens with the same nonzero id form one document, 0 marks padding (after the
last document of a row). The delta-rule ops reset their state where a document starts and skip padding; the
layers mask their convolutions and attention at the same boundaries (`document_index`).
"""

import jax
import jax.numpy as jnp
import numpy as np


def check_segment_ids(segment_ids, dims):
  """segment_ids as an int32 array after checking it is an integer [B, T] with the B and T bound in dims (the
  names of `validation.check_shape`); ValueError naming segment_ids otherwise."""
  dtype = getattr(segment_ids, "dtype", None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f"segment_ids: expected an integer array [B, T] (0 = padding), got dtype {dtype}")
  expected = (dims.get("B", "?"), dims.get("T", "?"))
  if segment_ids.ndim != 2 or any(n != "?" and n != size for n, size in zip(expected, segment_ids.shape)):
    raise ValueError(f"segment_ids: expected shape [B, T] = {expected}, got {tuple(segment_ids.shape)}")
  return jnp.asarray(segment_ids, jnp.int32)


def document_starts(segment_ids):
  """[B, T] bool: the tokens that start a document after t = 0 (the id changes to a nonzero one), where a
  recurrence restarts from the zero state. The document at t = 0 continues from the initial state."""
  changed = segment_ids[:, 1:] != segment_ids[:, :-1]
  return jnp.pad(changed & (segment_ids[:, 1:] != 0), ((0, 0), (1, 0)))


def document_index(segment_ids):
  """[B, T] int32: the index of each token's document in its row (0, 1, ...), -1 on padding. Two tokens are in
  one document exactly when their indices are equal and not -1 (ids may repeat in a row; indices do not)."""
  index = jnp.cumsum(document_starts(segment_ids), axis=1, dtype=jnp.int32)
  return jnp.where(segment_ids == 0, -1, index)


def document_positions(segment_ids):
  """[B, T] int32: each token's position inside its document (0 at every document start), 0 on padding."""
  T = segment_ids.shape[1]
  t = jnp.arange(T, dtype=jnp.int32)
  start = jnp.where(document_starts(segment_ids), t, 0)
  return jnp.where(segment_ids == 0, 0, t - jax.lax.cummax(start, axis=1))


def mask_inputs(segment_ids, inputs, decay):
  """Zeroes every array of inputs (q, k, v or q, u, e, z, and gates: [B, T, H] or [B, T, H, D]) on padding, and
  the log decay also at document starts (where the state is reset, so its g has no effect). Zero k and v make
  every mixer's build write nothing (`mixer_inputs.Form`), zero q reads nothing, g = 0 keeps the state: a padding
  token is inert, its output 0; and through jnp.where the masked inputs get exactly zero gradient.

  Returns (inputs, decay, document starts [B, T] bool)."""
  starts, keep, _ = kernel_masks(segment_ids)
  keep = keep.reshape(keep.shape + (1,) * (decay.ndim - 2))
  return mask_padding(segment_ids, inputs), jnp.where(keep, decay, jnp.zeros((), decay.dtype)), starts


def kernel_masks(segment_ids):
  """The masks the Pallas path applies in its kernels, [B, T] bool each: (document starts, keep: where the log
  decay counts, not padding nor a start (the cumsum kernel zeroes g elsewhere, the backward dg), real: not
  padding (the forward kernels zero q and k elsewhere)). Zero q reads nothing and zero k makes u and e zero (where
  `Mixer.writes_vanish_with_k`), so a padding token writes and erases nothing whatever its values and gates hold;
  those then get exactly zero gradient without a pass over them."""
  starts, real = document_starts(segment_ids), segment_ids != 0
  return starts, real & ~starts, real


def mask_padding(segment_ids, inputs):
  """Zeroes every array of inputs ([B, T, ...]) on padding (id 0), through jnp.where: zero gradient there."""
  padding = segment_ids == 0
  by_token = lambda x: padding.reshape(padding.shape + (1,) * (x.ndim - 2))
  return [jnp.where(by_token(x), jnp.zeros((), x.dtype), x) for x in inputs]


def chunk_documents(starts, chunk_size):
  """[B, T] int32 from document starts [B, T] (T a multiple of chunk_size): at each token, the number of
  document starts at or before it inside its chunk. Two tokens of a chunk share a document exactly when these
  are equal; a token sees the state entering its chunk exactly when its count is 0. The chunked forms mask
  their decays with it (`chunk.chunk_intra`, the Pallas kernels)."""
  B, T = starts.shape
  count = jnp.cumsum(starts.reshape(B, T // chunk_size, chunk_size).astype(jnp.int32), axis=-1)
  return count.reshape(B, T)


def cu_seqlens_to_segment_ids(cu_seqlens, num_tokens=None):
  """fla-style cumulative sequence lengths (B = 1: documents [cu[i], cu[i+1]) of one row) -> segment ids
  [1, num_tokens] int32, documents numbered 1, 2, ...

  cu_seqlens: [n + 1] ints from 0, strictly increasing, ending at num_tokens (default: its last entry). Checked
  when its values are known (not under jit): ValueError otherwise."""
  values = None if isinstance(cu_seqlens, jax.core.Tracer) else np.asarray(cu_seqlens)
  if num_tokens is None:
    if values is None:
      raise ValueError("num_tokens: required when cu_seqlens is traced (under jit its last entry is not known)")
    num_tokens = int(values[-1])
  if values is not None:
    if values.ndim != 1 or values.size < 2 or not np.issubdtype(values.dtype, np.integer):
      raise ValueError(f"cu_seqlens: expected a 1-D integer array [n + 1] of at least 2 entries, got "
                       f"{values.dtype} shape {values.shape}")
    if values[0] != 0 or np.any(np.diff(values) <= 0) or values[-1] != num_tokens:
      raise ValueError(f"cu_seqlens: expected strictly increasing offsets from 0 to num_tokens = {num_tokens}, got "
                       f"{values.tolist()}")
  ends = jnp.asarray(cu_seqlens, jnp.int32)[1:]
  ids = jnp.searchsorted(ends, jnp.arange(num_tokens, dtype=jnp.int32), side="right") + 1
  return ids.astype(jnp.int32)[None]
