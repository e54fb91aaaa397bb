"""impl="pallas" of the Sparse Delta Memory recurrence: `pallas_kernels.sparse_tokens`, token by token.

The kernels move only the rows each token touches (W + R gathers and W writes per token and head, the
byte floor of the update), with no per-chunk algebra: at the H200 bench shape the chunked form's
coefficients and re-gathered rows cost more than the rows themselves (benchmarks/, 2026-11-30). Here XLA
forms the per-token weights the kernels need (a slot's summed weight within its token, its first entry),
and a custom_vjp saves the rows each token found before its write (T x W x V per head) for the backward
kernel, which undoes the writes in reverse.

Those rows are the op's training memory (17.2 GB fp32 at B 4, T 4096, H 2, W 128, V 1,024; the final table
beside them 2.1 GB). Two options shrink them: rows_dtype="bfloat16" saves them rounded (the forward is
unchanged, and so are the gradients of m0 and v, which do not read the rows; the others move by about bf16's
rounding), and rows_segments=K saves only the last of K token segments' rows, the backward replaying the
forward from m0 for each earlier segment (the same bits; (K - 1) / 2 forwards more).

table_dtype="bfloat16" stores the table itself in bf16 (each written row rounded as it is stored, the math in
fp32): the kernels then move half the bytes, and the rows they save are bf16 copies of the table's, so the undo is
exact. It changes the forward (lossy, like a bf16 state) and its gradients are those of the fp32 recurrence at the
rounded states; the accuracy against the fp32 table is in benchmarks/sdm/README.md.

Packed documents (starts, DESIGN.md section 9) run the kernels' packed variants (`pallas_kernels.sparse_tokens`): the
forward puts m0 back on each run's write slots after its last token, the backward transposes that and replays each
earlier run's writes from m0 (one forward's writes more in all), and returns dM0 per batch row. Every option above
works with them: the replay of rows segments runs the packed forward, and each segment's backward walks the full
per-token arrays between its bounds (a document may span segments). Padding is masked by the caller: zero weights,
g = 0 and beta = 0 write the rows a token found, bit for bit.
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.sparse_tokens import sparse_tokens_bwd, sparse_tokens_fwd
from sdm_jax.ops.pallas import interpret, next_pow2

MIN_DIM = 16  # entries (W, R) and value columns are padded to powers of two >= 16
ROWS_DTYPES = ("float32", "bfloat16")  # the first is the default: the exact backward (and the exact table)


def _dtype_name(argument, value):
  try:
    name = jnp.dtype(value).name
  except TypeError:
    name = None
  if name not in ROWS_DTYPES:
    raise ValueError(f"{argument}: expected one of {ROWS_DTYPES}, got {value!r}")
  return name


def check_rows_options(rows_dtype, rows_segments, table_dtype="float32"):
  """ValueError unless rows_dtype and table_dtype are among ROWS_DTYPES (names or dtypes) and rows_segments an
  int >= 1. Returns (rows dtype name, table dtype name); a bf16 table saves its rows in bf16 whatever rows_dtype."""
  rows_name, table_name = _dtype_name("rows_dtype", rows_dtype), _dtype_name("table_dtype", table_dtype)
  if isinstance(rows_segments, bool) or not isinstance(rows_segments, int) or rows_segments < 1:
    raise ValueError(f"rows_segments: expected an int >= 1, got {rows_segments!r}")
  return ("bfloat16" if table_name == "bfloat16" else rows_name), table_name


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


class Documents(NamedTuple):
  """Packed documents as the kernels walk them, [B, T] int32 per batch row (the heads share them). A run is a
  document with the padding after it; runs begin at t = 0 and at every document start."""
  starts: Any  # 1 where a document starts (t > 0)
  run_start: Any  # the first token of each token's run


def documents(starts):
  """Documents from starts [B, T] bool (`segments.document_starts`)."""
  T = starts.shape[1]
  t = jnp.arange(T, dtype=jnp.int32)
  return Documents(starts.astype(jnp.int32), jax.lax.cummax(jnp.where(starts, t, 0), axis=1))


def _restore_from(docs, hi):
  """sparse_tokens_fwd's restore_from for a forward over tokens 0..hi-1: at token t, its run's first token where
  token t + 1 starts a document (none after the call's last token), else t + 1."""
  following = jnp.pad(docs.starts[:, 1:hi], ((0, 0), (0, 1))) > 0
  return jnp.where(following, docs.run_start[:, :hi], jnp.arange(1, hi + 1, dtype=jnp.int32))


def _previous_run(docs):
  """sparse_tokens_bwd's previous_run: at a document start t, the first token of the run before t's, else t."""
  before = jnp.pad(docs.run_start[:, :-1], ((0, 0), (1, 0)))
  return jnp.where(docs.starts > 0, before, jnp.arange(docs.starts.shape[1], dtype=jnp.int32))


class Residuals(NamedTuple):
  """What the forward saves for the backward. rows: [B, H, T_last, W, V] in the rows dtype, the rows the last
  segment's tokens found before their writes; m0: the initial table as the op got it ([H, N, V] or
  [B, H, N, V]; None with one segment unpacked), what the backward replays the earlier segments (and, packed, the
  runs) from; final: the final table [B, H, N, V] fp32; the per-token inputs as the op got them ([B, T, H, ...]);
  docs: Documents or None (unpacked)."""
  m0: Any
  final: Any
  rows: Any
  k_idx: Any
  k_w: Any
  v: Any
  g: Any
  beta: Any
  q_idx: Any
  q_w: Any
  docs: Any


def segment_bounds(T, rows_segments):
  """Token boundaries 0 = b_0 < ... < b_K = T of the rows segments, as equal as whole tokens allow (K is
  capped at T)."""
  K = min(rows_segments, T)
  return [k * T // K for k in range(K + 1)]


def _batch_table(m0, B, table_dtype=ROWS_DTYPES[0]):
  return jnp.broadcast_to(m0, (B, *m0.shape[-3:])).astype(table_dtype)


def _packed_args(m0, docs, hi):
  """sparse_tokens_fwd's packed arguments for a forward over tokens 0..hi-1 ({} unpacked)."""
  return {} if docs is None else {"m0": m0, "restore_from": _restore_from(docs, hi)}


def _forward(m0, k_idx, k_w, v, g, beta, q_idx, q_w, save, rows_dtype=ROWS_DTYPES[0], rows_segments=1,
             table_dtype=ROWS_DTYPES[0], docs=None):
  """m0: [H, N, V] or [B, H, N, V] fp32 (broadcast over the batch and cast to table_dtype here); docs: Documents
  or None; the rest as the op's."""
  args = _forward_args(k_idx, k_w, v, g, beta, q_idx, q_w)
  T = v.shape[1]
  bounds = segment_bounds(T, rows_segments)
  final, o, *rows = sparse_tokens_fwd(_batch_table(m0, v.shape[0], table_dtype), *args, **_packed_args(m0, docs, T),
                                      save_rows=save, rows_dtype=jnp.dtype(rows_dtype), rows_from=bounds[-2],
                                      interpret=interpret())
  if not save:
    return (_tokens(o), final), None
  keep_m0 = len(bounds) > 2 or docs is not None
  return (_tokens(o), final), Residuals(m0 if keep_m0 else None, final, rows[0], k_idx, k_w, v, g, beta, q_idx, q_w,
                                        docs)


class BackwardTokens(NamedTuple):
  """sparse_tokens_bwd's per-token arguments, [B, H, T, ...]: all it takes but the tables and the rows."""
  k_idx: Any
  k_w: Any
  k_slot: Any
  k_first: Any
  decay: Any
  beta: Any
  v: Any
  q_idx: Any
  q_slot: Any
  d_o: Any


def _backward_tokens(residuals, d_o):
  r = residuals
  k_idx, k_w, k_slot, decay, beta, v, q_idx, _ = _forward_args(r.k_idx, r.k_w, r.v, r.g, r.beta, r.q_idx, r.q_w)
  k_first = _heads(_slot_groups(r.k_idx)[1].astype(jnp.float32))
  q_slot = _heads(_summed_within_token(r.q_idx, r.q_w))
  return BackwardTokens(k_idx, k_w, k_slot, k_first, decay, beta, v, q_idx, q_slot, _heads(d_o))


def _kernel_args(table, d_table, tokens, rows):
  t = tokens
  return (table, d_table, t.k_idx, t.k_w, t.k_slot, t.k_first, t.decay, t.beta, t.v, t.q_idx, t.q_slot, rows, t.d_o)


def _backward_args(residuals, d_o, d_final):
  """sparse_tokens_bwd's arguments from the forward's residuals (one rows segment) and the cotangents of o and
  the final table."""
  return _kernel_args(residuals.final, d_final, _backward_tokens(residuals, d_o), residuals.rows)


def _token_slice(args, lo, hi):  # [B, H, T, ...] arrays -> their tokens lo..hi-1
  return tuple(x[:, :, lo:hi] for x in args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(9, 10, 11))
def _sparse_delta_pallas(m0, k_idx, k_w, v, g, beta, q_idx, q_w, docs, rows_dtype, rows_segments, table_dtype):
  return _forward(m0, k_idx, k_w, v, g, beta, q_idx, q_w, False, table_dtype=table_dtype, docs=docs)[0]


def _fwd(m0, k_idx, k_w, v, g, beta, q_idx, q_w, docs, rows_dtype, rows_segments, table_dtype):
  return _forward(m0, k_idx, k_w, v, g, beta, q_idx, q_w, True, rows_dtype, rows_segments, table_dtype, docs)


def _bwd(rows_dtype, rows_segments, table_dtype, residuals, cotangents):
  """Walks the rows segments last to first. The last one's rows are saved; each earlier one's come from a replay
  of the forward over tokens 0..hi-1 from m0, which also gives the table after token hi - 1 that its backward
  starts from (the same bits as the forward's: the same kernel on the same inputs). Packed (residuals.docs), the
  packed kernels run instead: each segment's backward walks the full per-token arrays from hi - 1 down to lo, and
  dM0 gathers over the calls (and dM at token 0, the first run's)."""
  d_o, d_final = cotangents
  r = residuals
  packed = r.docs is not None
  B, T = r.v.shape[:2]
  bounds = segment_bounds(T, rows_segments)
  tokens = _backward_tokens(r, d_o)
  forward_args = _forward_args(r.k_idx, r.k_w, r.v, r.g, r.beta, r.q_idx, r.q_w) if len(bounds) > 2 else None
  previous_run = _previous_run(r.docs) if packed else None
  table, d_table, rows = r.final, d_final.astype(jnp.float32), r.rows
  d_m0 = jnp.zeros(table.shape, jnp.float32) if packed else None
  tile_sum = lambda x: jnp.sum(x, axis=2)  # the kernel's per value tile partial sums
  pieces = []
  for k in reversed(range(len(bounds) - 1)):
    lo, hi = bounds[k], bounds[k + 1]
    if hi < T:
      # The barrier keeps XLA from running the replay before the later segment's backward: it would then hold the
      # rows of both segments at once.
      d_table, d_m0, m0 = jax.lax.optimization_barrier((d_table, d_m0, r.m0))
      table, _, rows = sparse_tokens_fwd(_batch_table(m0, B, table_dtype), *_token_slice(forward_args, 0, hi),
                                         **_packed_args(m0, r.docs, hi), rows_dtype=jnp.dtype(rows_dtype),
                                         rows_from=lo, interpret=interpret())
    if packed:
      table, d_table, d_v, d_k_w, d_q_w, d_g, d_beta, d_m0 = sparse_tokens_bwd(
          *_kernel_args(table, d_table, tokens, rows), m0=r.m0, d_m0=d_m0, previous_run=previous_run,
          tokens=(lo, hi), interpret=interpret())
    else:
      table, d_table, d_v, d_k_w, d_q_w, d_g, d_beta = sparse_tokens_bwd(
          *_kernel_args(table, d_table, BackwardTokens(*_token_slice(tokens, lo, hi)), rows), interpret=interpret())
    pieces.append((d_v, tile_sum(d_k_w), tile_sum(d_q_w), tile_sum(d_g), tile_sum(d_beta)))
  d_v, d_k_w, d_q_w, d_g, d_beta = (_tokens(jnp.concatenate(x[::-1], axis=2)) for x in zip(*pieces))
  d_m0 = d_table if d_m0 is None else d_m0 + d_table  # packed: plus what reached token 0, the first run's table
  if r.m0 is not None and r.m0.ndim == 3:
    d_m0 = jnp.sum(d_m0, axis=0)
  return (d_m0, None, d_k_w, d_v.astype(r.v.dtype), d_g, d_beta, None, d_q_w, None)


_sparse_delta_pallas.defvjp(_fwd, _bwd)


def _pad_entries(idx, w):
  """Pads the last axis to a power of two >= 16 by repeating each token's first slot with weight 0: a slot
  listed twice is one slot with the summed weight, so the padding changes nothing."""
  extra = next_pow2(idx.shape[-1], MIN_DIM) - idx.shape[-1]
  if extra == 0:
    return idx, w
  rep = lambda x, fill: jnp.concatenate([x, jnp.broadcast_to(fill, (*x.shape[:-1], extra))], axis=-1)
  return rep(idx, idx[..., :1]), rep(w, jnp.zeros_like(w[..., :1]))


def sparse_delta_pallas(m0, k_idx, k_w, v, g, beta, q_idx, q_w, *, rows_dtype="float32", rows_segments=1,
                        table_dtype="float32", starts=None):
  """Same contract as `sparse_delta_chunk` without chunks (any T; m0 [H, N, V] or [B, H, N, V] fp32, floats fp32
  but v, which may be bf16: the kernels read it as fp32, and o comes in v's dtype; the final table fp32).
  rows_dtype, rows_segments: what the backward gets its rows from; table_dtype: what the table is stored in (the
  module docstring). starts: None or [B, T] bool, where packed documents start (each from m0; padding already
  masked by the caller: `sparse_delta.sparse_delta_rule`)."""
  rows_dtype, table_dtype = check_rows_options(rows_dtype, rows_segments, table_dtype)
  B, T, _, V = v.shape
  k_idx, k_w = _pad_entries(k_idx.astype(jnp.int32), k_w)
  q_idx, q_w = _pad_entries(q_idx.astype(jnp.int32), q_w)
  Vp = next_pow2(V, MIN_DIM)
  if Vp != V:  # zero value columns stay zero
    v = jnp.pad(v, [(0, 0)] * 3 + [(0, Vp - V)])
    m0 = jnp.pad(m0, [(0, 0)] * (m0.ndim - 1) + [(0, Vp - V)])
  docs = None if starts is None else documents(starts)
  if docs is None and len(segment_bounds(T, rows_segments)) == 2:  # no replay: the batch's table is all it needs
    m0 = _batch_table(m0, B)
  o, final = _sparse_delta_pallas(m0, k_idx, k_w, v, g, beta, q_idx, q_w, docs, rows_dtype, rows_segments,
                                  table_dtype)
  return o[..., :V], final[..., :V].astype(jnp.float32)
