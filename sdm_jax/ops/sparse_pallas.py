"""impl="pallas" of the Sparse Delta Memory recurrence: `pallas_kernels.sparse_tokens`, token by token.

The kernels move only the rows each token touches (W + R gathers and W writes per token and head, the
byte floor of the update), with no per-chunk algebra: at the H200 bench shape the chunked form's
coefficients and re-gathered rows cost more than the rows themselves (benchmarks/sdm/README.md). Here XLA
forms the per-token weights the kernels need (a slot's summed weight within its token and its first entry, from a
sort of each token's entries; with distinct slots, the entries' own weights, every entry first; for the backward,
each write slot's read weight at its token, `read_at_writes`, unpacked only), and a custom_vjp
saves the rows each token found before its write (T x W x V per head) for the backward kernel, which undoes the
writes in reverse.

Those rows are the op's training memory (17.2 GB fp32 at B 4, T 4096, H 2, W 128, V 1,024; the final table
beside them 2.1 GB). Two options shrink them: rows_dtype="bfloat16" saves them rounded (the forward is
unchanged, and so are the gradients of m0 and v, which do not read the rows; the others move by about bf16's
rounding), and rows_segments=K saves only the last of K token segments' rows, the backward replaying the
forward from m0 for each earlier segment (the same bits; (K - 1) / 2 forwards more).

table_dtype="bfloat16" stores the table itself in bf16 (each written row rounded as it is stored, the math in
fp32): the kernels then move half the bytes, and the rows they save are bf16 copies of the table's, so the undo is
exact. It changes the forward (lossy, like a bf16 state) and its gradients are those of the fp32 recurrence at the
rounded states; the accuracy against the fp32 table is in benchmarks/sdm/README.md. table_grad_dtype="bfloat16"
stores the table's cotangent dM in bf16 while the backward walks the tokens (each row of dM rounded as it is stored,
the math in fp32; dM0 of packed documents and the returned gradient of m0 stay fp32): dM is 4 of the backward's 5.5
row sets with a bf16 table, so this cuts its bytes further (benchmarks/sdm/README.md, launch settings). It
changes only the gradients (lossy).

Packed documents (starts, DESIGN.md section 9) run the kernels' packed variants (`pallas_kernels.sparse_tokens`):
XLA first codes every index by whether the token's run (its document and the padding after it) has written that slot
before (`packed_codes`: one sort of every row's and head's T (W + R) indices), and the kernels read m0's row where
it has not. No pass puts m0 back between runs and the backward replays nothing: the forward saves the rows each
token read beside those it found (the op's training memory twice the unpacked op's: [B, H, T, R, V] more), so the
backward needs no table and undoes nothing; it sends the cotangent of every stale row to dM0. Every option above
works with them (the replay of rows segments runs the packed forward). The final table is the kernels' on the last
run's write slots and m0 elsewhere. Padding is masked by the caller: zero weights, g = 0 and beta = 0 write the rows
a token found, bit for bit.
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.sparse_tokens import DEFAULT_LAUNCH, check_launch, sparse_tokens_bwd, sparse_tokens_fwd
from sdm_jax.ops.pallas import interpret, next_pow2
from sdm_jax.ops.sparse_chunk import ChunkConfig

MIN_DIM = 16  # entries (W, R) and value columns are padded to powers of two >= 16
ROWS_DTYPES = ("float32", "bfloat16")  # the first is the default: the exact backward (and the exact table)
DEFAULT_LAUNCHES = (DEFAULT_LAUNCH,) * 2  # the token kernels' (forward, backward) launch


def _dtype_name(argument, value):
  try:
    name = jnp.dtype(value).name
  except TypeError:
    name = None
  if name not in ROWS_DTYPES:
    raise ValueError(f"{argument}: expected one of {ROWS_DTYPES}, got {value!r}")
  return name


def _launches(launch):
  """launch, (forward, backward) launch settings each (block_v, num_warps), as a pair of sparse_tokens.Launch (None:
  DEFAULT_LAUNCHES), or ValueError naming launch."""
  if launch is None:
    return DEFAULT_LAUNCHES
  if not isinstance(launch, (tuple, list)) or len(launch) != 2:
    raise ValueError(f"launch: expected (forward, backward) launch settings, each (block_v, num_warps), got "
                     f"{launch!r}")
  return check_launch("launch[0] (forward)", launch[0]), check_launch("launch[1] (backward)", launch[1])


@dataclasses.dataclass(frozen=True)
class PallasConfig(ChunkConfig):
  """What impl="pallas" runs with (the module docstring). rows_dtype, rows_segments: what the backward gets the rows
  each token found from (saved in rows_dtype, or replayed from m0 for all but the last of rows_segments token
  segments); table_dtype: what the table is stored in while the kernels walk the tokens; table_grad_dtype: what the
  backward stores the table's cotangent in (each one of ROWS_DTYPES, given by name or dtype, held by name);
  launch: the token kernels' (forward, backward) launch settings, each (block_v, num_warps) (`sparse_tokens.Launch`;
  the grid is (B, H, V / block_v)), None for DEFAULT_LAUNCHES: a tuning knob, the results the same up to the order
  of the per-tile sums of the per-entry cotangents. chunk_size is checked like the chunked form's, since the op takes
  one whatever impl runs, and unused: the kernels walk the tokens. ValueError naming the field otherwise."""
  rows_dtype: str = ROWS_DTYPES[0]
  rows_segments: int = 1
  table_dtype: str = ROWS_DTYPES[0]
  table_grad_dtype: str = ROWS_DTYPES[0]
  launch: Any = DEFAULT_LAUNCHES

  def __post_init__(self):
    super().__post_init__()
    for name in ("rows_dtype", "table_dtype", "table_grad_dtype"):
      object.__setattr__(self, name, _dtype_name(name, getattr(self, name)))
    if isinstance(self.rows_segments, bool) or not isinstance(self.rows_segments, int) or self.rows_segments < 1:
      raise ValueError(f"rows_segments: expected an int >= 1, got {self.rows_segments!r}")
    object.__setattr__(self, "launch", _launches(self.launch))

  @property
  def saved_rows_dtype(self):
    """The dtype the rows are saved in: rows_dtype, but bf16 with a bf16 table (its rows are bf16 already)."""
    return ROWS_DTYPES[1] if self.table_dtype == ROWS_DTYPES[1] else self.rows_dtype


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


def _summed_within_token(idx, w, distinct=False):
  """w [..., W] summed over the entries of the same token that list the same slot (exact fp32 sums); distinct (no
  token lists a slot twice): w itself."""
  if distinct:
    return w
  W = idx.shape[-1]
  group, _ = _slot_groups(idx)
  flat = lambda x: x.reshape(-1, W)
  sums = jax.vmap(lambda g, x: jnp.zeros_like(x).at[g].add(x)[g])(flat(group), flat(w))
  return sums.reshape(w.shape)


def _heads(x):  # [B, T, H, ...] -> [B, H, T, ...], the kernels' layout
  return jnp.moveaxis(x, 2, 1)


def _tokens(x):  # [B, H, T, ...] -> [B, T, H, ...]
  return jnp.moveaxis(x, 1, 2)


def _forward_args(k_idx, k_w, v, g, beta, q_idx, q_w, distinct=False):
  """sparse_tokens_fwd's per-token arguments (after the table), in its [B, H, T, ...] layout. distinct: no token
  lists a slot twice."""
  k_slot = _summed_within_token(k_idx, k_w, distinct)
  return tuple(_heads(x) for x in (k_idx, k_w, k_slot, jnp.exp(g), beta, v, q_idx, q_w))


class Packed(NamedTuple):
  """Packed documents as the kernels take them, per head ([B, H, ...]): k_code [T, W] and q_code [T, R], the indices
  coded by `_codes` (~slot where the token's run has not written the slot yet), and written_last [N] bool, the
  slots the row's last run writes: the final table is the kernels' (raw) one there and m0 elsewhere."""
  k_code: Any
  q_code: Any
  written_last: Any


def _codes(k, q, run_start, N, one_key=None):
  """k [B, H, T, W] and q [B, H, T, R] slots < N, run_start [B, T] (the first token of each token's run) ->
  (k_code, q_code): a slot where the token's run wrote it before (a write index: at an earlier token; a read index,
  read after its token's write: at that token or an earlier), else ~slot. One sort of all B H T (W + R) entries,
  laid out by (row, head, token, write before read), by the key (row, head, slot), stable: equal keys keep that
  time order, so an entry's latest earlier write of its slot is the last write entry before its group (the entries
  of one token and kind with that slot). The key is one uint32, row-head * N + slot, where it fits (one_key=None):
  one batch with an unsigned key is what XLA's sort rewriter gives to CUB's radix sort on Hopper (a sort batched
  over rows and heads stays XLA's own at these sizes); else two int32 keys."""
  B, H, T, W = k.shape
  E = W + q.shape[-1]
  slot = jnp.concatenate([k, q], axis=-1).reshape(B * H, T * E)
  n = slot.size
  position = jnp.arange(n, dtype=jnp.int32)
  if one_key is None:
    one_key = B * H * N <= 2 ** 32
  if one_key:
    key = (jnp.arange(B * H, dtype=jnp.uint32)[:, None] * jnp.uint32(N) + slot.astype(jnp.uint32)).reshape(-1)
    key, position = jax.lax.sort((key, position), num_keys=1, is_stable=True)
    keys = (key,)
  else:
    row_heads = jnp.broadcast_to(jnp.arange(B * H, dtype=jnp.int32)[:, None], slot.shape).reshape(-1)
    *keys, position = jax.lax.sort((row_heads, slot.reshape(-1), position), num_keys=2, is_stable=True)
  row_head, entry = position // (T * E), position % (T * E)
  token, is_write = entry // E, entry % E < W
  when = 2 * token + (~is_write).astype(jnp.int32)  # a token's write at 2t, its read (after its write) at 2t + 1
  index = jnp.arange(n, dtype=jnp.int32)
  new_group = jnp.concatenate([jnp.ones(1, bool), functools.reduce(
      jnp.logical_or, [x[1:] != x[:-1] for x in (*keys, when)])])
  group_start = jax.lax.cummax(jnp.where(new_group, index, 0))
  last_write = jax.lax.cummax(jnp.where(is_write, index, -1))
  before = jnp.where(group_start > 0, last_write[jnp.maximum(group_start - 1, 0)], -1)
  earlier = jnp.maximum(before, 0)
  same_slot = functools.reduce(jnp.logical_and, [x[earlier] == x for x in keys])
  written = (before >= 0) & same_slot & (token[earlier] >= run_start[row_head // H, token])
  value = (keys[-1] % keys[-1].dtype.type(N)).astype(jnp.int32)  # the entry's slot
  code = jnp.zeros(n, jnp.int32).at[position].set(jnp.where(written, value, ~value), unique_indices=True)
  code = code.reshape(B, H, T, E)
  return code[..., :W], code[..., W:]


def packed_codes(k_idx, q_idx, starts, N):
  """Packed from k_idx [B, T, H, W], q_idx [B, T, H, R] (slots) and starts [B, T] bool (`segments.document_starts`).
  A run is a document with the padding after it; runs begin at t = 0 and at every document start."""
  T = starts.shape[1]
  t = jnp.arange(T, dtype=jnp.int32)
  run_start = jax.lax.cummax(jnp.where(starts, t, 0), axis=1)
  k, q = _heads(k_idx), _heads(q_idx)
  k_code, q_code = _codes(k, q, run_start, N)
  last = (t >= run_start[:, -1:])[:, None, :, None]  # [B, 1, T, 1]: the tokens of each row's last run
  mark = lambda rows: jnp.zeros(N, bool).at[rows.reshape(-1)].set(True, mode="drop")
  written_last = jax.vmap(jax.vmap(mark))(jnp.where(last, k, N))
  return Packed(k_code, q_code, written_last)


class Residuals(NamedTuple):
  """What the forward saves for the backward. rows: [B, H, T_last, W, V] in the rows dtype, the rows the last
  segment's tokens found before their writes (packed: m0's at stale slots); reads: packed, [B, H, T_last, R, V], the
  rows they read (None unpacked); m0: the initial table as the op got it ([H, N, V] or [B, H, N, V]; None with one
  segment unpacked), what the backward replays the earlier segments from; final: unpacked, the kernels' final table
  [B, H, N, V] (None packed: that backward has no table); the per-token inputs as the op got them ([B, T, H, ...]);
  packed: Packed or None (unpacked)."""
  m0: Any
  final: Any
  rows: Any
  reads: Any
  k_idx: Any
  k_w: Any
  v: Any
  g: Any
  beta: Any
  q_idx: Any
  q_w: Any
  packed: Any


def segment_bounds(T, rows_segments):
  """Token boundaries 0 = b_0 < ... < b_K = T of the rows segments, as equal as whole tokens allow (K is
  capped at T)."""
  K = min(rows_segments, T)
  return [k * T // K for k in range(K + 1)]


def _start_table(m0, B, packed, table_dtype):
  """sparse_tokens_fwd's (table, table_dtype): unpacked, m0 broadcast over the batch in table_dtype (the kernel
  writes into it); packed, no table and its dtype (the kernel makes the table: it never reads a row no token of the
  run wrote)."""
  if packed is None:
    return _batch_table(m0, B, table_dtype), None
  return None, jnp.dtype(table_dtype)


def _batch_table(m0, B, table_dtype=ROWS_DTYPES[0]):
  return jnp.broadcast_to(m0, (B, *m0.shape[-3:])).astype(table_dtype)


def _stale_rows(m0, packed, table_dtype):
  """What the packed kernels read stale rows from: m0 in the table's dtype, as a table of that dtype holds it (the
  kernels round its rows to that dtype anyway, so a bf16 table loads half the bytes for the same bits); None
  unpacked."""
  return None if packed is None else m0.astype(table_dtype)


def _kernel_forward_args(k_idx, k_w, v, g, beta, q_idx, q_w, packed, distinct):
  """`_forward_args`, packed with the coded indices in place of the slots."""
  args = _forward_args(k_idx, k_w, v, g, beta, q_idx, q_w, distinct)
  if packed is None:
    return args
  return (packed.k_code, *args[1:6], packed.q_code, args[7])


def _forward(m0, k_idx, k_w, v, g, beta, q_idx, q_w, save, config, packed, distinct):
  """m0: [H, N, V] or [B, H, N, V] fp32 (broadcast over the batch and cast to the table dtype here); save: whether
  the backward's rows are saved (the rows options apply only then); config: PallasConfig; packed: Packed or None;
  distinct: no token lists a slot twice; the rest as the op's."""
  B, T = v.shape[:2]
  bounds = segment_bounds(T, config.rows_segments if save else 1)
  rows_dtype = config.saved_rows_dtype if save else ROWS_DTYPES[0]
  table_dtype = config.table_dtype
  args = _kernel_forward_args(k_idx, k_w, v, g, beta, q_idx, q_w, packed, distinct)
  stale_rows = _stale_rows(m0, packed, table_dtype)
  table, kernel_table_dtype = _start_table(m0, B, packed, table_dtype)
  raw, o, *rows = sparse_tokens_fwd(table, *args, m0=stale_rows, table_dtype=kernel_table_dtype,
                                    save_rows=save, rows_dtype=jnp.dtype(rows_dtype), rows_from=bounds[-2],
                                    **config.launch[0]._asdict(), interpret=interpret())
  final = raw if packed is None else jnp.where(packed.written_last[..., None], raw, stale_rows.astype(table_dtype))
  if not save:
    return (_tokens(o), final), None
  keep_m0 = len(bounds) > 2 or packed is not None
  # Packed, the backward needs no table: the rows each token read are saved beside those it found.
  found, reads = rows if packed is not None else (rows[0], None)
  return (_tokens(o), final), Residuals(m0 if keep_m0 else None, raw if packed is None else None, found, reads, k_idx,
                                        k_w, v, g, beta, q_idx, q_w, packed)


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
  k_read: Any
  d_o: Any


def read_at_writes(k_idx, q_idx, q_slot, distinct=False):
  """k_idx [..., W], q_idx [..., R] (one token's slots per row), q_slot [..., R] (each read entry's summed slot
  weight) -> [..., W]: the read weight of each write entry's slot, 0 where the token does not read it. The backward
  kernel adds that much dO to dM at the write slots it gathers with the read's rows, instead of gathering them again
  after the read's addition. One nonzero term per sum (a slot's first read entry; distinct: every entry), so exact."""
  first = jnp.ones(q_idx.shape, bool) if distinct else _slot_groups(q_idx)[1]
  weight = jnp.where(first, q_slot, 0.0)
  return jnp.sum(jnp.where(k_idx[..., :, None] == q_idx[..., None, :], weight[..., None, :], 0.0), axis=-1)


def _backward_tokens(residuals, d_o, distinct):
  r = residuals
  k_idx, k_w, k_slot, decay, beta, v, q_idx, _ = _kernel_forward_args(r.k_idx, r.k_w, r.v, r.g, r.beta, r.q_idx,
                                                                      r.q_w, r.packed, distinct)
  # Distinct slots: every entry is its slot's first.
  k_first = jnp.ones_like(k_w) if distinct else _heads(_slot_groups(r.k_idx)[1].astype(jnp.float32))
  q_slot = _summed_within_token(r.q_idx, r.q_w, distinct)
  # The packed kernel gathers dM at the write slots after the read's store and takes no k_read (zeros here).
  k_read = jnp.zeros_like(r.k_w) if r.packed is not None else read_at_writes(r.k_idx, r.q_idx, q_slot, distinct)
  return BackwardTokens(k_idx, k_w, k_slot, k_first, decay, beta, v, q_idx, _heads(q_slot), _heads(k_read),
                        _heads(d_o))


def _kernel_args(table, d_table, tokens, rows):
  t = tokens
  return (table, d_table, t.k_idx, t.k_w, t.k_slot, t.k_first, t.decay, t.beta, t.v, t.q_idx, t.q_slot, t.k_read,
          rows, t.d_o)


def _token_slice(args, lo, hi):  # [B, H, T, ...] arrays -> their tokens lo..hi-1
  return tuple(x[:, :, lo:hi] for x in args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(9, 10))
def _sparse_delta_pallas(m0, k_idx, k_w, v, g, beta, q_idx, q_w, packed, config, distinct):
  return _forward(m0, k_idx, k_w, v, g, beta, q_idx, q_w, False, config, packed, distinct)[0]


def _fwd(m0, k_idx, k_w, v, g, beta, q_idx, q_w, packed, config, distinct):
  return _forward(m0, k_idx, k_w, v, g, beta, q_idx, q_w, True, config, packed, distinct)


def _bwd(config, distinct, residuals, cotangents):
  """Walks the rows segments last to first. The last one's rows are saved; each earlier one's come from a replay
  of the forward over tokens 0..hi-1 from m0, which also gives the table after token hi - 1 that its backward
  starts from (the same bits as the forward's: the same kernel on the same inputs). Packed (residuals.packed), the
  final table's cotangent splits between dM (the last run's write slots) and dM0 (elsewhere, where the final table
  is m0), and the kernels add to dM0 as they go; the dM they leave is then 0. dM is held in config.table_grad_dtype,
  dM0 and the returned gradient of m0 in fp32."""
  d_o, d_final = cotangents
  r = residuals
  B, T = r.v.shape[:2]
  bounds = segment_bounds(T, config.rows_segments)
  table_dtype, launch = config.table_dtype, config.launch
  tokens = _backward_tokens(r, d_o, distinct)
  forward_args = None  # the replay's: the backward's per-token arrays, with q_w
  if len(bounds) > 2:
    forward_args = (tokens.k_idx, tokens.k_w, tokens.k_slot, tokens.decay, tokens.beta, tokens.v, tokens.q_idx,
                    _heads(r.q_w))
  table, d_table, rows, reads = r.final, d_final.astype(jnp.float32), r.rows, r.reads
  d_m0 = None
  if r.packed is not None:
    last = r.packed.written_last[..., None]
    d_table, d_m0 = jnp.where(last, d_table, 0.0), jnp.where(last, 0.0, d_table)
  d_table = d_table.astype(config.table_grad_dtype)
  tile_sum = lambda x: jnp.sum(x, axis=2)  # the kernel's per value tile partial sums
  stale_rows = _stale_rows(r.m0, r.packed, table_dtype)
  pieces = []
  for k in reversed(range(len(bounds) - 1)):
    lo, hi = bounds[k], bounds[k + 1]
    if hi < T:
      # The barrier keeps XLA from running the replay before the later segment's backward: it would then hold the
      # rows of both segments at once.
      d_table, d_m0, m0, stale_rows = jax.lax.optimization_barrier((d_table, d_m0, r.m0, stale_rows))
      start, kernel_table_dtype = _start_table(m0, B, r.packed, table_dtype)
      table, _, rows, *reads = sparse_tokens_fwd(start, *_token_slice(forward_args, 0, hi), m0=stale_rows,
                                                 table_dtype=kernel_table_dtype,
                                                 rows_dtype=jnp.dtype(config.saved_rows_dtype), rows_from=lo,
                                                 **launch[0]._asdict(), interpret=interpret())
      reads = reads[0] if reads else None
    args = _kernel_args(table, d_table, BackwardTokens(*_token_slice(tokens, lo, hi)), rows)
    if r.packed is None:
      table, d_table, d_v, d_k_w, d_q_w, d_g, d_beta = sparse_tokens_bwd(*args, **launch[1]._asdict(),
                                                                         interpret=interpret())
    else:
      d_table, d_v, d_k_w, d_q_w, d_g, d_beta, d_m0 = sparse_tokens_bwd(None, *args[1:], reads=reads, d_m0=d_m0,
                                                                        **launch[1]._asdict(), interpret=interpret())
    pieces.append((d_v, tile_sum(d_k_w), tile_sum(d_q_w), tile_sum(d_g), tile_sum(d_beta)))
  d_v, d_k_w, d_q_w, d_g, d_beta = (_tokens(jnp.concatenate(x[::-1], axis=2)) for x in zip(*pieces))
  d_m0 = (d_table if d_m0 is None else d_m0).astype(jnp.float32)
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


def sparse_delta_pallas(m0, k_idx, k_w, v, g, beta, q_idx, q_w, config=PallasConfig(), *, starts=None,
                        distinct_slots=False):
  """Same contract as `sparse_delta_chunk` without chunks (any T; m0 [H, N, V] or [B, H, N, V] fp32, floats fp32
  but v, which may be bf16: the kernels read it as fp32, and o comes in v's dtype; the final table fp32).
  config: PallasConfig, what the backward gets its rows from, what the table and its cotangent are stored in and
  the kernels' launch settings. starts: None or [B, T] bool, where packed documents start (each from m0; padding
  already masked by the caller: `sparse_delta.sparse_delta_rule`). distinct_slots: the caller's promise that no
  token lists a slot twice in k_idx, nor in q_idx: the per-slot weights are then the entries' own, with no sort (not
  where W or R is padded, which repeats a slot)."""
  B, T, _, V = v.shape
  widths = k_idx.shape[-1], q_idx.shape[-1]
  k_idx, k_w = _pad_entries(k_idx.astype(jnp.int32), k_w)
  q_idx, q_w = _pad_entries(q_idx.astype(jnp.int32), q_w)
  distinct = bool(distinct_slots) and widths == (k_idx.shape[-1], q_idx.shape[-1])
  Vp = next_pow2(V, MIN_DIM)
  if Vp != V:  # zero value columns stay zero
    v = jnp.pad(v, [(0, 0)] * 3 + [(0, Vp - V)])
    m0 = jnp.pad(m0, [(0, 0)] * (m0.ndim - 1) + [(0, Vp - V)])
  packed = None if starts is None else packed_codes(k_idx, q_idx, starts, m0.shape[-2])
  if packed is None and len(segment_bounds(T, config.rows_segments)) == 2:  # no replay: the batch's table is all it needs
    m0 = _batch_table(m0, B)
  o, final = _sparse_delta_pallas(m0, k_idx, k_w, v, g, beta, q_idx, q_w, packed, config, distinct)
  return o[..., :V], final[..., :V].astype(jnp.float32)
