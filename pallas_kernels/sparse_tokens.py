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
  1. the read: d_rho[r] = <M_t[J_t[r]], dO_t>, dM[J_t] += rho_slot dO_t;
  2. the write, from the saved rows P = M_{t-1}[I_t]: with dM_t = dM[I_t] and e = exp(g_t),
     dd = sum_w kappa[w] dM_t[w], dv = beta dd, d_beta = <dd, v - r>, dr = -beta dd,
     d_kappa[w] = <dM_t[w], d> + <e P[w], dr>, dM[I_t] = e (dM_t + kappa_slot dr) (the cotangent of
     M_{t-1} there), d_g = sum over the token's distinct slots <dM[I_t], P>; then M[I_t] = P (the undo).
The scalar and per-entry cotangents are per value tile; the caller sums the tiles.
Shapes ([B, H, T, ...]): k_idx, k_w, k_slot, k_first [.., W]; q_idx, q_w, q_slot [.., R]; decay, beta
[B, H, T]; v, d_o [.., V]; rows [.., W, V] (fp32 or, rounded, bf16: the undo then restores the rounded rows);
table [B, H, N, V] fp32 or bf16 (then the rows saved in bf16 are exact, and so is the undo). W, R, V powers of two.
A backward over tokens lo..hi-1 alone takes those tokens' slices and the table after token hi - 1
(`sparse_tokens_fwd` over tokens 0..hi-1 with rows_from = lo gives both).

Packed documents (DESIGN.md section 9; the kernels' packed variants, chosen statically by passing m0). A run is one
document with any padding after it; runs begin at t = 0 and at every document start, and each starts from m0. The
forward puts m0's rows back on every slot a run wrote once its last token has read (walking that run's write
indices: W rows per token, never N per document), so the table at each run's start is m0 everywhere and the
rows saved before each write stay those the backward undoes it with. The backward transposes that restore: having
undone a run's first token t, it moves dM into dM0 on the previous run's write slots (zeroing dM there: a slot
listed again moves 0), puts m0 back on them and replays the previous run's writes from m0, which rebuilds the
table at that run's end (the undo left m0 wherever the later run wrote). dM left at token 0 is the cotangent of
the initial table, another part of dM0 (the caller adds it).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton


def _tools(bv, interpret):
  cols = jax.lax.broadcasted_iota(jnp.int32, (1, bv), 1)
  at_rows = lambda idx: (idx[:, None], cols)  # the table rows at a vector of slots: a gather or a scatter
  barrier = (lambda: None) if interpret else pltriton.debug_barrier
  return at_rows, barrier


def _write(table_ref, k_w_ref, k_slot_ref, decay_ref, beta_ref, v_ref, t, k_rows, rows, barrier):
  """Token t's write, from the rows (fp32) the table held at its write slots k_rows before it."""
  rows = decay_ref[t] * rows
  r = jnp.sum(k_w_ref[t, :][:, None] * rows, axis=0, keepdims=True)
  d = beta_ref[t] * (v_ref[pl.ds(t, 1), :].astype(jnp.float32) - r)
  barrier()  # a slot listed twice: every copy is read before any is rewritten
  table_ref[k_rows] = (rows + k_slot_ref[t, :][:, None] * d).astype(table_ref.dtype)
  barrier()  # the writes land before the reads


def _restore(table_ref, m0_ref, k_idx_ref, at_rows, barrier, lo, hi):
  """m0's rows back at the write slots of tokens lo..hi-1 (a run, once its last token has read). Every write puts
  m0's own row on its slot, so the order among them does not matter (duplicates write one value): no barrier
  between them, and two tokens' gathers of m0 in flight at once (the second of a pair clamped to hi - 1, restored
  twice at an odd count)."""

  def pair(i, carry):
    slots = [at_rows(k_idx_ref[jnp.minimum(lo + 2 * i + j, hi - 1), :]) for j in (0, 1)]
    rows = [m0_ref[at].astype(table_ref.dtype) for at in slots]
    for at, row in zip(slots, rows):
      table_ref[at] = row
    return carry

  barrier()  # the reads before the restore are done
  jax.lax.fori_loop(0, (hi - lo + 1) // 2, pair, 0)
  barrier()  # the restore lands before the next token's gathers


def _fwd_kernel(k_idx_ref, k_w_ref, k_slot_ref, decay_ref, beta_ref, v_ref, q_idx_ref, q_w_ref, table_in_ref, *refs,
                rows_from, packed, interpret):
  del table_in_ref  # aliased with table_ref
  if packed:
    m0_ref, restore_from_ref, *refs = refs
  table_ref, o_ref, *rows_ref = refs
  f32 = jnp.float32
  T, bv = v_ref.shape
  at_rows, barrier = _tools(bv, interpret)
  gather = lambda idx: table_ref[at_rows(idx)].astype(f32)  # the table may be stored in bf16; the math is fp32
  write = functools.partial(_write, table_ref, k_w_ref, k_slot_ref, decay_ref, beta_ref, v_ref, barrier=barrier)

  def token(t, rows, save):
    """rows: the table at token t's write slots, gathered after token t - 1's writes (with its read)."""
    k_rows = at_rows(k_idx_ref[t, :])
    if save:
      rows_ref[0][t - rows_from] = rows.astype(rows_ref[0].dtype)
    write(t, k_rows, rows)
    # Token t's read and token t + 1's write rows are gathered together: one memory round trip per token (the
    # kernel 20.664 -> 19.025 ms at B 4, T 4096, H 2, V 1,024, W = R = 128 on the H200; 2026-11-30,
    # benchmarks/sessions/2026-11-30_h200_session12.md).
    read = gather(q_idx_ref[t, :])
    if packed:  # where token t + 1 starts a document, m0 back on its run's write slots (restore_from[t] = t + 1: none)
      jax.lax.cond(restore_from_ref[t] <= t,
                   lambda: _restore(table_ref, m0_ref, k_idx_ref, at_rows, barrier, restore_from_ref[t], t + 1),
                   lambda: None)
    following = gather(k_idx_ref[jnp.minimum(t + 1, T - 1), :])
    o = jnp.sum(q_w_ref[t, :][:, None] * read, axis=0, keepdims=True)
    o_ref[pl.ds(t, 1), :] = o.astype(o_ref.dtype)
    return following

  rows = gather(k_idx_ref[0, :])
  if rows_from:
    rows = jax.lax.fori_loop(0, rows_from, functools.partial(token, save=False), rows)
  jax.lax.fori_loop(rows_from, T, functools.partial(token, save=bool(rows_ref)), rows)


def _specs(block_v):
  sq = pl.squeezed
  per_head = lambda *shape: pl.BlockSpec((sq, sq, *shape), lambda b, h, j: (b, h) + (0,) * len(shape))
  tile = lambda *shape: pl.BlockSpec((sq, sq, *shape, block_v), lambda b, h, j: (b, h) + (0,) * len(shape) + (j,))
  per_tile = lambda *shape: pl.BlockSpec((sq, sq, sq, *shape), lambda b, h, j: (b, h, j) + (0,) * len(shape))
  return per_head, tile, per_tile


def _document_specs(m0, block_v):
  """BlockSpecs of m0 ([H, N, V] shared over the batch, or [B, H, N, V]) and of a per-row [B, T] token array."""
  sq = pl.squeezed
  N = m0.shape[-2]
  if m0.ndim == 3:
    m0_spec = pl.BlockSpec((sq, N, block_v), lambda b, h, j: (h, 0, j))
  else:
    m0_spec = pl.BlockSpec((sq, sq, N, block_v), lambda b, h, j: (b, h, 0, j))
  return m0_spec, lambda T: pl.BlockSpec((sq, T), lambda b, h, j: (b, 0))


@functools.partial(jax.jit, static_argnames=("save_rows", "rows_dtype", "rows_from", "block_v", "num_warps",
                                             "num_stages", "interpret"))
def sparse_tokens_fwd(table, k_idx, k_w, k_slot, decay, beta, v, q_idx, q_w, *, m0=None, restore_from=None,
                      save_rows=True, rows_dtype=jnp.float32, rows_from=0, block_v=32, num_warps=4, num_stages=1,
                      interpret=False):
  """Returns (final table [B, H, N, V] in table's dtype, o [B, H, T, V] in v.dtype) and with save_rows the rows
  that tokens rows_from..T-1 found before their writes, rows [B, H, T - rows_from, W, V] in rows_dtype (what the
  backward undoes the writes with; the forward itself computes with the rows as the table holds them). table: fp32,
  or bf16 (each token's written rows rounded to bf16 as they are stored; the math stays fp32). Launch
  settings: the fastest of block_v 8-128 and 2-8 warps at the H200 bench shape (block_v 32: 20.2 ms, 16: 31.2,
  64: 23.6; benchmarks/sessions/2026-11-30_h200_session11.md).
  Packed documents (the module docstring): m0 [H, N, V] or [B, H, N, V] fp32 (table then holds it at t = 0) and
  restore_from [B, T] int32: at token t, the first token of t's run where token t + 1 starts a document, else t + 1."""
  B, H, N, V = table.shape
  T, W = k_idx.shape[2:]
  R = q_idx.shape[-1]
  block_v = min(block_v, V)
  per_head, tile, _ = _specs(block_v)
  out_shape = [jax.ShapeDtypeStruct(table.shape, table.dtype), jax.ShapeDtypeStruct((B, H, T, V), v.dtype)]
  out_specs = [tile(N), tile(T)]
  if not 0 <= rows_from < T:
    raise ValueError(f"rows_from: expected a token in [0, T) = [0, {T}), got {rows_from}")
  if save_rows:
    out_shape.append(jax.ShapeDtypeStruct((B, H, T - rows_from, W, V), rows_dtype))
    out_specs.append(tile(T - rows_from, W))
  packed = m0 is not None
  in_specs = [per_head(T, W), per_head(T, W), per_head(T, W), per_head(T), per_head(T), tile(T), per_head(T, R),
              per_head(T, R), tile(N)]
  documents = ()
  if packed:
    m0_spec, per_row = _document_specs(m0, block_v)
    in_specs += [m0_spec, per_row(T)]
    documents = (m0, restore_from)
  return pl.pallas_call(
      functools.partial(_fwd_kernel, rows_from=rows_from, packed=packed, interpret=interpret),
      out_shape=tuple(out_shape),
      grid=(B, H, V // block_v),
      in_specs=in_specs,
      out_specs=tuple(out_specs),
      input_output_aliases={8: 0},
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="sparse_tokens_fwd",
  )(k_idx, k_w, k_slot, decay, beta, v, q_idx, q_w, table, *documents)


def _bwd_kernel(k_idx_ref, k_w_ref, k_slot_ref, k_first_ref, decay_ref, beta_ref, v_ref, q_idx_ref, q_slot_ref,
                rows_ref, d_o_ref, table_in_ref, d_table_in_ref, *refs, tokens, interpret):
  del table_in_ref, d_table_in_ref  # aliased with table_ref, d_table_ref
  packed = tokens is not None
  if packed:
    m0_ref, d_m0_in_ref, previous_run_ref, *refs = refs
    del d_m0_in_ref  # aliased with d_m0_ref
  table_ref, d_table_ref, d_v_ref, d_k_w_ref, d_q_w_ref, d_g_ref, d_beta_ref, *d_m0_ref = refs
  f32 = jnp.float32
  T, bv = v_ref.shape
  lo, hi = (0, T) if tokens is None else tokens
  at_rows, barrier = _tools(bv, interpret)
  write = functools.partial(_write, table_ref, k_w_ref, k_slot_ref, decay_ref, beta_ref, v_ref, barrier=barrier)

  def move(s, carry, restore):
    """The transposed restore at token s's write slots: dM moves into dM0 (dM there is 0 after it); with restore,
    m0's rows go back there too."""
    k_rows = at_rows(k_idx_ref[s, :])
    d_rows, d_m0_rows = d_table_ref[k_rows], d_m0_ref[0][k_rows]
    barrier()
    d_m0_ref[0][k_rows] = d_m0_rows + d_rows
    d_table_ref[k_rows] = jnp.zeros_like(d_rows)
    if restore:
      table_ref[k_rows] = m0_ref[k_rows].astype(table_ref.dtype)
    barrier()
    return carry

  def replay(s, carry):
    k_rows = at_rows(k_idx_ref[s, :])
    write(s, k_rows, table_ref[k_rows].astype(f32))
    return carry

  def token(i, carry):
    t = hi - 1 - i
    local = t - lo if lo else t  # rows and the per-token cotangents cover tokens lo..hi-1
    found = rows_ref[local].astype(f32)  # loaded first: it depends on nothing the token writes
    # 1. The read of token t, on M_t.
    q_rows = at_rows(q_idx_ref[t, :])
    d_o = d_o_ref[pl.ds(t, 1), :].astype(f32)
    d_q_w_ref[local, :] = jnp.sum(table_ref[q_rows].astype(f32) * d_o, axis=1)
    d_read = d_table_ref[q_rows]
    barrier()
    d_table_ref[q_rows] = d_read + q_slot_ref[t, :][:, None] * d_o
    barrier()
    # 2. The write of token t, from the rows it found.
    k_rows = at_rows(k_idx_ref[t, :])
    decay, beta = decay_ref[t], beta_ref[t]
    k_w = k_w_ref[t, :][:, None]
    decayed = decay * found
    v_r = v_ref[pl.ds(t, 1), :].astype(f32) - jnp.sum(k_w * decayed, axis=0, keepdims=True)
    d_written = d_table_ref[k_rows]
    dd = jnp.sum(k_w * d_written, axis=0, keepdims=True)
    dr = -beta * dd
    d_v_ref[pl.ds(local, 1), :] = beta * dd
    d_beta_ref[pl.ds(local, 1)] = jnp.sum(dd * v_r, axis=1)
    d_k_w_ref[local, :] = jnp.sum(d_written * (beta * v_r) + decayed * dr, axis=1)
    d_found = decay * (d_written + k_slot_ref[t, :][:, None] * dr)
    d_g_ref[pl.ds(local, 1)] = jnp.sum(jnp.sum(k_first_ref[t, :][:, None] * d_found * found, axis=1), axis=0,
                                       keepdims=True)
    barrier()
    d_table_ref[k_rows] = d_found
    table_ref[k_rows] = found.astype(table_ref.dtype)
    barrier()
    if packed:
      # Where token t starts a document, the table is m0 wherever its run wrote: the previous run (tokens
      # previous_run[t]..t-1) gets its restore transposed and its writes replayed. At t = lo that is the call for
      # the tokens before lo (its table comes from the forward, its dM from this call).
      previous = previous_run_ref[t] if lo == 0 else jnp.where(t > lo, previous_run_ref[t], t)
      jax.lax.fori_loop(previous, t, functools.partial(move, restore=True), 0)
      jax.lax.fori_loop(previous, t, replay, 0)
    return carry

  if packed and hi < T:  # token hi starts a document: the restore after token hi - 1, transposed (the table is right)
    jax.lax.fori_loop(previous_run_ref[hi], hi, functools.partial(move, restore=False), 0)
  jax.lax.fori_loop(0, hi - lo, token, 0)


@functools.partial(jax.jit, static_argnames=("tokens", "block_v", "num_warps", "num_stages", "interpret"))
def sparse_tokens_bwd(table, d_table, k_idx, k_w, k_slot, k_first, decay, beta, v, q_idx, q_slot, rows, d_o, *,
                      m0=None, d_m0=None, previous_run=None, tokens=None, block_v=32, num_warps=8, num_stages=1,
                      interpret=False):
  """table: the final table (fp32 or bf16), d_table: its cotangent, fp32 (both overwritten in place). Returns
  (the initial table in table's dtype, its cotangent [B, H, N, V], d_v [B, H, T, V] fp32, and per value tile
  [B, H, V / block_v, T, ...]: d_k_w [W], d_q_w [R], d_g [], d_beta []), d_g for the log decay g (decay = exp(g)).
  Launch settings as for the forward (block_v 32 with 8 warps: 44.6 ms at the H200 bench shape, 16 with 4: 69.0).

  Packed documents (the module docstring): m0 as for the forward; d_m0 [B, H, N, V] fp32, the cotangent of m0 so far
  (updated in place and returned last: dM0 of every run but the first; the caller adds the returned dM, the first
  run's); previous_run [B, T] int32: at token t, the first token of the run before t's where t starts a document,
  else t; tokens (lo, hi), static: the backward walks tokens hi - 1 down to lo of the per-token arrays (all T
  tokens), from the table after token hi - 1 and dM before token hi; rows and the per-token cotangents cover tokens
  lo..hi-1."""
  B, H, N, V = table.shape
  T, W = k_idx.shape[2:]
  R = q_idx.shape[-1]
  block_v = min(block_v, V)
  nv = V // block_v
  per_head, tile, per_tile = _specs(block_v)
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  packed = m0 is not None
  if packed:
    tokens = (0, T) if tokens is None else tokens
    lo, hi = tokens
    if not 0 <= lo < hi <= T or rows.shape[2] != hi - lo:
      raise ValueError(f"tokens: expected 0 <= lo < hi <= T = {T} with rows for hi - lo tokens, got {tokens} and "
                       f"rows for {rows.shape[2]}")
  elif tokens is not None:
    raise ValueError("tokens: only with packed documents (m0)")
  L = rows.shape[2]  # the tokens walked
  out_shape = [jax.ShapeDtypeStruct(table.shape, table.dtype), f32(B, H, N, V), f32(B, H, L, V), f32(B, H, nv, L, W),
               f32(B, H, nv, L, R), f32(B, H, nv, L), f32(B, H, nv, L)]
  out_specs = [tile(N), tile(N), tile(L), per_tile(L, W), per_tile(L, R), per_tile(L), per_tile(L)]
  in_specs = [per_head(T, W), per_head(T, W), per_head(T, W), per_head(T, W), per_head(T), per_head(T), tile(T),
              per_head(T, R), per_head(T, R), tile(L, W), tile(T), tile(N), tile(N)]
  aliases = {11: 0, 12: 1}
  documents = ()
  if packed:
    m0_spec, per_row = _document_specs(m0, block_v)
    in_specs += [m0_spec, tile(N), per_row(T)]
    out_shape.append(f32(B, H, N, V))
    out_specs.append(tile(N))
    aliases[14] = 7
    documents = (m0, d_m0, previous_run)
  return pl.pallas_call(
      functools.partial(_bwd_kernel, tokens=tokens, interpret=interpret),
      out_shape=tuple(out_shape),
      grid=(B, H, nv),
      in_specs=in_specs,
      out_specs=tuple(out_specs),
      input_output_aliases=aliases,
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="sparse_tokens_bwd",
  )(k_idx, k_w, k_slot, k_first, decay, beta, v, q_idx, q_slot, rows, d_o, table, d_table, *documents)
