"""Pallas (Triton) kernels for the Sparse Delta Memory recurrence token by token (DESIGN.md section 3).

The recurrence is independent per value column, so each program owns one tile of block_v columns of
one (batch, head) table and walks the tokens in order on it, in place:

    rows = M[I_t]                        (W rows; a slot listed twice is gathered twice)
    r    = sum_w kappa_t[w] exp(g_t) rows[w],   d = beta_t (v_t - r)
    M[I_t] = exp(g_t) rows + kappa_slot_t d     (kappa_slot: the summed weight of the entry's slot, so
                                                 duplicates write the same value)
    o_t  = sum_r rho_t[r] M[J_t]          (read after the write)

No per-chunk algebra is formed: every token costs its W + R row gathers and W row writes, the byte floor
of the update. Barriers order the memory traffic of a program's threads: all of a token's row reads
before its writes (duplicates), and the writes before the reads that follow.

The backward walks the tokens in reverse with the table cotangent dM in place. Per token t, on M_t:
  1. the read: d_rho[r] = <M_t[J_t[r]], dO_t> (packed: the saved rows it read), dM[J_t] += rho_slot dO_t;
  2. the write, from the saved rows P = M_{t-1}[I_t]: with dM_t = dM[I_t] (after 1.: the rows gathered with the
     read's, before it, plus k_read dO_t, k_read the read's weight of each write entry's slot, 0 where the token does
     not read it: one memory round trip a token, the read's rows and the write's; the packed variant gathers
     dM_t after 1.'s store instead) and e = exp(g_t),
     dd = sum_w kappa[w] dM_t[w], dv = beta dd, d_beta = <dd, v - r>, dr = -beta dd,
     d_kappa[w] = <dM_t[w], d> + <e P[w], dr>, dM[I_t] = e (dM_t + kappa_slot dr) (the cotangent of
     M_{t-1} there), d_g = sum over the token's distinct slots <dM[I_t], P>; then M[I_t] = P (the undo; packed,
     none).
The scalar and per-entry cotangents are per value tile; the caller sums the tiles.
Shapes ([B, H, T, ...]): k_idx, k_w, k_slot, k_first, k_read [.., W]; q_idx, q_w, q_slot [.., R]; decay, beta
[B, H, T]; v, d_o [.., V]; rows [.., W, V] (fp32 or, rounded, bf16: the undo then restores the rounded rows);
table [B, H, N, V] fp32 or bf16 (then the rows saved in bf16 are exact, and so is the undo). W, R, V powers of two.
A backward over tokens lo..hi-1 alone takes those tokens' slices and the table after token hi - 1
(`sparse_tokens_fwd` over tokens 0..hi-1 with rows_from = lo gives both).

Packed documents (DESIGN.md section 9; the kernels' packed variants, chosen statically by passing m0). A run is one
document with any padding after it; runs begin at t = 0 and at every document start, and each starts from m0. No
pass restores m0 between runs: the caller codes every index by whether the token's run has written that slot before
(the write indices: at an earlier token; the read indices: at this token or an earlier one), a slot it has not as
~slot (< 0), and the kernels take that row from m0 instead of the table (loading the table's row only where the slot
is fresh). The table thus holds what the latest run to write each slot left there ("raw"), which the math never
reads at a stale slot; nor does it read a row that no token has written, so the packed forward takes no table: its
table is an output alone (not initialised: no copy of m0 into it). So the packed backward does not undo the writes:
the forward saves the rows each token read as well as those it found (both as the math took them), and the backward
walks the tokens on dM alone, sending the cotangent that reaches a stale row to dM0 instead of dM (and leaving dM 0
where a stale write was), so that dM holds only the current run's. Its row traffic a token, against the unpacked
op's 4 forward and 7 backward row sets (p the stale share of the entries): 5 forward (the reads saved) and 6 + 2p
backward (no table rows read or restored; dM0 read and written at the stale write slots), at twice the saved rows.
The final table comes out raw (rows no token wrote undefined): the caller puts m0 outside the last run's write
slots.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.launch import named_call, require


class Launch(NamedTuple):
  """A token kernel's launch settings (`launch.LaunchSettings`; the kernels take them as block_v and num_warps):
  block_v value columns per program (a power of two >= 16, capped at V) and num_warps per program (a power of two
  <= 32). The grid is (B, H, V / block_v): one program per (batch, head, value tile)."""
  block_v: int = 64
  num_warps: int = 8

  @classmethod
  def defaults(cls, shape=None):
    """block_v 64 with 8 warps, forward and backward, at every shape: one wave of programs at the bench shape and
    the fastest measured with fp32 and bf16 tables (benchmarks/sdm/README.md, launch settings)."""
    return cls()

  @classmethod
  def candidates(cls, shape):
    """The launches `run_h200.sh sdm_launch` sweeps, block_v capped at shape.V."""
    V, = require(shape, cls.__name__, "V")
    swept = ((64, 8), (64, 4), (64, 16), (32, 4), (32, 8), (128, 8), (128, 16), (16, 4))
    return tuple(dict.fromkeys(cls(min(block_v, V), num_warps) for block_v, num_warps in swept))


DEFAULT_LAUNCH = Launch.defaults()
SETTINGS = (Launch,)


def check_launch(name, launch):
  """launch, (block_v, num_warps), as a Launch (None: DEFAULT_LAUNCH), or ValueError naming it."""
  if launch is None:
    return DEFAULT_LAUNCH
  power_of_two = lambda n, lo, hi: (isinstance(n, int) and not isinstance(n, bool) and lo <= n <= hi
                                    and n & (n - 1) == 0)
  if (not isinstance(launch, (tuple, list)) or len(launch) != 2 or not power_of_two(launch[0], 16, 1 << 16)
      or not power_of_two(launch[1], 1, 32)):
    raise ValueError(f"{name}: expected (block_v, num_warps) with block_v a power of two >= 16 and num_warps a "
                     f"power of two <= 32, got {launch!r}")
  return Launch(*launch)


def _tools(bv, interpret):
  cols = jax.lax.broadcasted_iota(jnp.int32, (1, bv), 1)
  at_rows = lambda idx: (idx[:, None], cols)  # the table rows at a vector of slots: a gather or a scatter
  barrier = (lambda: None) if interpret else pltriton.debug_barrier
  return at_rows, barrier


def _coded_rows(at_rows, code, packed):
  """(at, fresh): the table rows at a token's slots and, packed (coded indices: ~slot where the token's run has not
  written the slot), which of them its run has written, [.., 1] bool (None unpacked)."""
  if not packed:
    return at_rows(code), None
  return at_rows(jnp.where(code < 0, ~code, code)), (code >= 0)[:, None]


def _table_rows(ref, at, mask):
  """ref's rows at `at`; given a [.., 1] bool mask (fresh slots, or ~fresh: stale ones), only where it holds (0
  elsewhere, not loaded)."""
  return ref[at] if mask is None else pltriton.load(ref.at[at], mask=mask, other=0.0)


def _math_rows(raw, m0_ref, at, fresh, dtype):
  """The rows the math reads from the table's (fp32) raw ones: packed, m0's where the slot is stale (loaded only
  there, fp32 after a round trip through the table's dtype, as a table of that dtype would hold them)."""
  if fresh is None:
    return raw
  m0_rows = _table_rows(m0_ref, at, ~fresh).astype(dtype).astype(jnp.float32)
  return jnp.where(fresh, raw, m0_rows)


def _token_inputs(t, **refs):
  """Token t's entry of each per-token input, by name: a scalar from a [T] ref, a row [n] from a [T, n] one (v and
  d_o, [T, bv] tiles, keep [1, bv]). The kernels load these a token ahead and carry them: loaded where they are
  needed, each is a memory round trip of its own on every token's dependent chain (Nsight Compute on the forward:
  over half its stall samples waited on them, not on the table's rows; benchmarks/sdm/README.md)."""
  return {name: ref[t] if ref.ndim == 1 else ref[pl.ds(t, 1), :] if name in ("v", "d_o") else ref[t, :]
          for name, ref in refs.items()}


def _write(table_ref, x, k_rows, rows, barrier):
  """A token's write from its inputs x (`_token_inputs`) and the rows (fp32) the table held at its write slots
  k_rows before it."""
  rows = x["decay"] * rows
  r = jnp.sum(x["k_w"][:, None] * rows, axis=0, keepdims=True)
  d = x["beta"] * (x["v"].astype(jnp.float32) - r)
  barrier()  # a slot listed twice: every copy is read before any is rewritten
  table_ref[k_rows] = (rows + x["k_slot"][:, None] * d).astype(table_ref.dtype)
  barrier()  # the writes land before the reads


def _fwd_kernel(k_idx_ref, k_w_ref, k_slot_ref, decay_ref, beta_ref, v_ref, q_idx_ref, q_w_ref, *refs, rows_from,
                packed, interpret):
  # After the per-token inputs: packed, m0 (no table in: the table is an output alone, its rows read only after a
  # token of the run wrote them); unpacked, the table in, aliased with table_ref.
  m0_ref, *refs = refs
  m0_ref = m0_ref if packed else None
  table_ref, o_ref, *rows_ref = refs
  f32 = jnp.float32
  T, bv = v_ref.shape
  at_rows, barrier = _tools(bv, interpret)
  inputs = dict(k_idx=k_idx_ref, k_w=k_w_ref, k_slot=k_slot_ref, decay=decay_ref, beta=beta_ref, v=v_ref,
                q_idx=q_idx_ref, q_w=q_w_ref)
  ahead = lambda t: _token_inputs(jnp.minimum(t, T - 1), **inputs)

  def gather(code):
    """The rows the math reads at the coded slots, fp32 (the table may be stored in bf16): packed, m0's where the
    slot is stale and the table's (loaded only there) where it is fresh."""
    at, fresh = _coded_rows(at_rows, code, packed)
    return _math_rows(_table_rows(table_ref, at, fresh).astype(f32), m0_ref, at, fresh, table_ref.dtype)

  def token(t, carry, save):
    """carry: the rows at token t's write slots, gathered after token t - 1's writes (with its read), and token
    t's inputs."""
    rows, x = carry
    x_next = ahead(t + 1)  # issued first; used from this token's last gather on
    k_rows = _coded_rows(at_rows, x["k_idx"], packed)[0]
    if save:  # the rows it found: what the backward's math (unpacked: its undo too) takes
      rows_ref[0][t - rows_from] = rows.astype(rows_ref[0].dtype)
    _write(table_ref, x, k_rows, rows, barrier)
    # Token t's read and token t + 1's write rows are gathered together: one memory round trip per token (faster;
    # benchmarks/ops/README.md, launch settings).
    read = gather(x["q_idx"])
    following = gather(x_next["k_idx"])
    if save and packed:  # the rows it read: the packed backward has no table
      rows_ref[1][t - rows_from] = read.astype(rows_ref[1].dtype)
    o = jnp.sum(x["q_w"][:, None] * read, axis=0, keepdims=True)
    o_ref[pl.ds(t, 1), :] = o.astype(o_ref.dtype)
    return following, x_next

  x = ahead(0)
  carry = gather(x["k_idx"]), x
  if rows_from:
    carry = jax.lax.fori_loop(0, rows_from, functools.partial(token, save=False), carry)
  jax.lax.fori_loop(rows_from, T, functools.partial(token, save=bool(rows_ref)), carry)


def _specs(block_v):
  sq = pl.squeezed
  per_head = lambda *shape: pl.BlockSpec((sq, sq, *shape), lambda b, h, j: (b, h) + (0,) * len(shape))
  tile = lambda *shape: pl.BlockSpec((sq, sq, *shape, block_v), lambda b, h, j: (b, h) + (0,) * len(shape) + (j,))
  per_tile = lambda *shape: pl.BlockSpec((sq, sq, sq, *shape), lambda b, h, j: (b, h, j) + (0,) * len(shape))
  return per_head, tile, per_tile


def _m0_spec(m0, block_v):
  """The BlockSpec of m0: [H, N, V] shared over the batch, or [B, H, N, V]."""
  sq = pl.squeezed
  N = m0.shape[-2]
  if m0.ndim == 3:
    return pl.BlockSpec((sq, N, block_v), lambda b, h, j: (h, 0, j))
  return pl.BlockSpec((sq, sq, N, block_v), lambda b, h, j: (b, h, 0, j))


@functools.partial(jax.jit, static_argnames=("table_dtype", "save_rows", "rows_dtype", "rows_from", "block_v",
                                             "num_warps", "num_stages", "interpret"))
def sparse_tokens_fwd(table, k_idx, k_w, k_slot, decay, beta, v, q_idx, q_w, *, m0=None, table_dtype=None,
                      save_rows=True, rows_dtype=jnp.float32, rows_from=0, block_v=DEFAULT_LAUNCH.block_v,
                      num_warps=DEFAULT_LAUNCH.num_warps, num_stages=1, interpret=False):
  """Returns (final table [B, H, N, V] in table's dtype, o [B, H, T, V] in v.dtype) and with save_rows the rows
  that tokens rows_from..T-1 found before their writes, rows [B, H, T - rows_from, W, V] in rows_dtype (what the
  backward undoes the writes with; the forward itself computes with the rows as the table holds them). table: fp32,
  or bf16 (each token's written rows rounded to bf16 as they are stored; the math stays fp32). block_v, num_warps:
  the launch (`Launch`; by default its `defaults`), num_stages Triton's pipelining stages.
  Packed documents (the module docstring): table None, table_dtype the table's (fp32 or bf16; default m0's), m0
  [H, N, V] or [B, H, N, V], fp32 or the table's dtype (its rows rounded to that dtype as they are loaded), k_idx and
  q_idx coded (~slot where the token's run has not written the slot); the rows
  saved are those the math found (m0's at stale slots), and with save_rows a second array follows them, reads
  [B, H, T - rows_from, R, V] in rows_dtype, the rows each token read (the packed backward takes both and no table);
  the final table raw (rows no token wrote undefined: the caller puts m0 there)."""
  packed = m0 is not None
  if packed == (table is not None) or (table_dtype is not None and not packed):
    raise ValueError("sparse_tokens_fwd: expected a table (unpacked) or m0 and optionally table_dtype (packed), got "
                     f"table {'None' if table is None else table.shape}, m0 {'None' if m0 is None else m0.shape} "
                     f"and table_dtype {table_dtype}")
  B, H, T, W = k_idx.shape
  N, V = (m0 if packed else table).shape[-2:]
  dtype = table.dtype if not packed else m0.dtype if table_dtype is None else jnp.dtype(table_dtype)
  R = q_idx.shape[-1]
  block_v = min(block_v, V)
  per_head, tile, _ = _specs(block_v)
  if not 0 <= rows_from < T:
    raise ValueError(f"rows_from: expected a token in [0, T) = [0, {T}), got {rows_from}")
  operands = dict(k_idx=(k_idx, per_head(T, W)), k_w=(k_w, per_head(T, W)), k_slot=(k_slot, per_head(T, W)),
                  decay=(decay, per_head(T)), beta=(beta, per_head(T)), v=(v, tile(T)), q_idx=(q_idx, per_head(T, R)),
                  q_w=(q_w, per_head(T, R)))
  if packed:
    operands["m0"] = (m0, _m0_spec(m0, block_v))
  else:  # written in place
    operands["table"] = (table, tile(N))
  results = dict(table=(jax.ShapeDtypeStruct((B, H, N, V), dtype), tile(N)),
                 o=(jax.ShapeDtypeStruct((B, H, T, V), v.dtype), tile(T)))
  if save_rows:
    results["rows"] = (jax.ShapeDtypeStruct((B, H, T - rows_from, W, V), rows_dtype), tile(T - rows_from, W))
    if packed:
      results["reads"] = (jax.ShapeDtypeStruct((B, H, T - rows_from, R, V), rows_dtype), tile(T - rows_from, R))
  return named_call(
      functools.partial(_fwd_kernel, rows_from=rows_from, packed=packed, interpret=interpret), operands, results,
      in_place=() if packed else ("table",), grid=(B, H, V // block_v),
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages), interpret=interpret,
      name="sparse_tokens_fwd")


def _bwd_kernel(k_idx_ref, k_w_ref, k_slot_ref, k_first_ref, decay_ref, beta_ref, v_ref, q_idx_ref, q_slot_ref,
                k_read_ref, rows_ref, d_o_ref, *refs, packed, interpret):
  if packed:  # no table: the rows each token read are saved (reads_ref), as are those it found (rows_ref)
    reads_ref, d_table_in_ref, d_m0_in_ref, d_table_ref, d_v_ref, d_k_w_ref, d_q_w_ref, d_g_ref, d_beta_ref, \
        d_m0_ref = refs
    del d_table_in_ref, d_m0_in_ref  # aliased with d_table_ref, d_m0_ref
  else:
    table_in_ref, d_table_in_ref, table_ref, d_table_ref, d_v_ref, d_k_w_ref, d_q_w_ref, d_g_ref, d_beta_ref = refs
    del table_in_ref, d_table_in_ref  # aliased with table_ref, d_table_ref
  f32 = jnp.float32
  T, bv = v_ref.shape
  at_rows, barrier = _tools(bv, interpret)
  rows_at = functools.partial(_coded_rows, at_rows, packed=packed)
  inputs = dict(k_idx=k_idx_ref, k_w=k_w_ref, k_slot=k_slot_ref, k_first=k_first_ref, decay=decay_ref,
                beta=beta_ref, v=v_ref, q_idx=q_idx_ref, q_slot=q_slot_ref, k_read=k_read_ref, d_o=d_o_ref)
  if packed:  # gathers dM at the write slots after the read's store: no k_read
    del inputs["k_read"]
  ahead = lambda t: _token_inputs(jnp.maximum(t, 0), **inputs)

  def token(t, x):
    """x: token t's inputs, loaded during token t + 1; returns token t - 1's."""
    x_next = ahead(t - 1)  # issued first; used from the next token on
    found = rows_ref[t].astype(f32)  # loaded early: it depends on nothing the token writes
    k_rows, k_fresh = rows_at(x["k_idx"])
    q_rows, q_fresh = rows_at(x["q_idx"])
    d_o = x["d_o"].astype(f32)
    # Every row the token reads, in one round trip: M_t at the read slots (packed: saved) and dM there (packed: dM0's
    # part at the stale ones), and, unpacked, dM at the write slots before the read's addition, which k_read supplies.
    # Packed, those are gathered after the read's store: gathered in this round trip they spill registers and the
    # packed op is slower (benchmarks/sdm/README.md, launch settings).
    read = (reads_ref[t] if packed else table_ref[q_rows]).astype(f32)
    d_read = _table_rows(d_table_ref, q_rows, q_fresh).astype(f32)
    if packed:
      d_m0_read = _table_rows(d_m0_ref, q_rows, ~q_fresh)
    else:
      k_read = x["k_read"][:, None]
      d_written = d_table_ref[k_rows].astype(f32)
      d_written = jnp.where(k_read != 0, d_written + k_read * d_o, d_written)
    # 1. The read of token t, on M_t; its cotangent is stored once every row above has been read (a slot listed
    # twice, or both read and written).
    d_q_w_ref[t, :] = jnp.sum(read * d_o, axis=1)
    delta = x["q_slot"][:, None] * d_o
    barrier()
    if packed:  # the read's cotangent of a stale row is m0's
      pltriton.store(d_table_ref.at[q_rows], (d_read + delta).astype(d_table_ref.dtype), mask=q_fresh)
      pltriton.store(d_m0_ref.at[q_rows], d_m0_read + delta, mask=~q_fresh)
    else:
      d_table_ref[q_rows] = (d_read + delta).astype(d_table_ref.dtype)
    # 2. The write of token t, from the rows it found (packed: m0's at stale slots).
    if packed:  # dM at the write slots, the read's addition included
      barrier()
      d_written = d_table_ref[k_rows].astype(f32)
    decay, beta = x["decay"], x["beta"]
    k_w = x["k_w"][:, None]
    decayed = decay * found
    v_r = x["v"].astype(f32) - jnp.sum(k_w * decayed, axis=0, keepdims=True)
    dd = jnp.sum(k_w * d_written, axis=0, keepdims=True)
    dr = -beta * dd
    d_v_ref[pl.ds(t, 1), :] = beta * dd
    d_beta_ref[pl.ds(t, 1)] = jnp.sum(dd * v_r, axis=1)
    d_k_w_ref[t, :] = jnp.sum(d_written * (beta * v_r) + decayed * dr, axis=1)
    d_found = decay * (d_written + x["k_slot"][:, None] * dr)
    d_g_ref[pl.ds(t, 1)] = jnp.sum(jnp.sum(x["k_first"][:, None] * d_found * found, axis=1), axis=0, keepdims=True)
    if packed:
      d_m0_found = _table_rows(d_m0_ref, k_rows, ~k_fresh)
    barrier()  # a slot both read and written: the write's cotangent lands last
    if packed:  # the cotangent of a stale row is m0's: dM0 takes it, and dM there is 0 (the write replaced the row)
      d_table_ref[k_rows] = jnp.where(k_fresh, d_found, 0.0).astype(d_table_ref.dtype)
      pltriton.store(d_m0_ref.at[k_rows], d_m0_found + d_found, mask=~k_fresh)
    else:
      d_table_ref[k_rows] = d_found.astype(d_table_ref.dtype)
      table_ref[k_rows] = found.astype(table_ref.dtype)  # the undo
    barrier()
    return x_next

  jax.lax.fori_loop(0, T, lambda i, x: token(T - 1 - i, x), ahead(T - 1))


@functools.partial(jax.jit, static_argnames=("block_v", "num_warps", "num_stages", "interpret"))
def sparse_tokens_bwd(table, d_table, k_idx, k_w, k_slot, k_first, decay, beta, v, q_idx, q_slot, k_read, rows, d_o, *,
                      reads=None, d_m0=None, block_v=DEFAULT_LAUNCH.block_v, num_warps=DEFAULT_LAUNCH.num_warps,
                      num_stages=1, interpret=False):
  """table: the final table (fp32 or bf16), d_table: its cotangent dM, fp32 or bf16 (then every row of dM the
  kernel updates is rounded to bf16 as it is stored; the math stays fp32), both overwritten in place; k_read
  [B, H, T, W]: per write entry, the summed read weight (q_slot) of its slot at the same token, 0 where the token does
  not read that slot (`sdm_jax.ops.sparse_pallas.read_at_writes`). Returns
  (the initial table in table's dtype, its cotangent [B, H, N, V], d_v [B, H, T, V] fp32, and per value tile
  [B, H, V / block_v, T, ...]: d_k_w [W], d_q_w [R], d_g [], d_beta []), d_g for the log decay g (decay = exp(g)).
  block_v, num_warps, num_stages: the launch, as the forward's.

  Packed documents (the module docstring): table None, the coded k_idx, q_idx as for the forward, rows and reads the
  packed forward's (the rows each token found and read); d_m0 [B, H, N, V] fp32, the cotangent of m0 so far (updated
  in place). Returns (dM, d_v, d_k_w, d_q_w, d_g, d_beta, dM0): no table. dM returned is 0 wherever a run wrote (its
  first write there was stale); a backward over tokens lo..hi-1 alone takes those tokens' slices. k_read is not read
  (it gathers dM at the write slots after the read's store)."""
  packed = reads is not None
  if packed != (d_m0 is not None) or packed != (table is None):
    raise ValueError("table, reads and d_m0: expected the table alone (unpacked) or reads and d_m0 without it (packed "
                     "documents)")
  B, H, N, V = d_table.shape
  T, W = k_idx.shape[2:]
  R = q_idx.shape[-1]
  block_v = min(block_v, V)
  nv = V // block_v
  per_head, tile, per_tile = _specs(block_v)
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  like = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
  operands = dict(k_idx=(k_idx, per_head(T, W)), k_w=(k_w, per_head(T, W)), k_slot=(k_slot, per_head(T, W)),
                  k_first=(k_first, per_head(T, W)), decay=(decay, per_head(T)), beta=(beta, per_head(T)),
                  v=(v, tile(T)), q_idx=(q_idx, per_head(T, R)), q_slot=(q_slot, per_head(T, R)),
                  k_read=(k_read, per_head(T, W)), rows=(rows, tile(T, W)), d_o=(d_o, tile(T)))
  results = {}
  if packed:  # no table: the rows each token read, and dM0
    operands.update(reads=(reads, tile(T, R)), d_table=(d_table, tile(N)), d_m0=(d_m0, tile(N)))
  else:
    operands.update(table=(table, tile(N)), d_table=(d_table, tile(N)))
    results["table"] = (like(table), tile(N))
  results.update(d_table=(like(d_table), tile(N)), d_v=(f32(B, H, T, V), tile(T)),
                 d_k_w=(f32(B, H, nv, T, W), per_tile(T, W)), d_q_w=(f32(B, H, nv, T, R), per_tile(T, R)),
                 d_g=(f32(B, H, nv, T), per_tile(T)), d_beta=(f32(B, H, nv, T), per_tile(T)))
  if packed:
    results["d_m0"] = (f32(B, H, N, V), tile(N))
  return named_call(
      functools.partial(_bwd_kernel, packed=packed, interpret=interpret), operands, results,
      in_place=tuple(name for name in ("table", "d_table", "d_m0") if name in operands), grid=(B, H, nv),
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages), interpret=interpret,
      name="sparse_tokens_bwd")
