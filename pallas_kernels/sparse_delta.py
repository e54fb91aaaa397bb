"""Pallas (Triton) forward kernel for the chunked Sparse Delta Memory update (SPEC.md section 3).

The value-independent algebra of a chunk (slot matching, per-slot decays, the triangular solve)
is small and comes from XLA (`sdm_jax.ops.sparse_chunk.chunk_addressing`); this kernel does the
part that grows with d_v: gathering the touched table rows, the [C, C] products and the row
writes, sequential over chunks, in place on the table.

Grid (B, H, V / block_v), each program owns one column tile of one table. Per chunk:
  1. gather the chunk-start rows at k_idx (kept for the backward) and q_idx:
     r0 = sum_w r0_coef * rows_k, o_read = sum_r read_coef * rows_q;
  2. Delta = solve (v - r0), o = o_read + A_qk Delta;
  3. after a barrier (all of this chunk's reads precede its writes), token by token, the entries of
     the first token that touches a slot write keep * (its chunk-start row, still in the table) +
     sum_s slot_write[t, w, s] Delta_s (duplicates within that token write the same value, after a
     barrier that orders all of the token's row reads first); the slot's entries in later tokens
     are masked out. A second barrier orders the writes before the next chunk's reads.
Shapes ([B, H, Nc, C, ...], Nc chunks of C tokens): k_idx [.., W] int32, q_idx [.., R] int32,
r0_coef, keep, first [.., W] fp32, read_coef [.., R], solve, a_qk [.., C], slot_write [.., W, C],
v [.., V]; table [B, H, N, V] fp32. W, R, C >= 16 and V a multiple of block_v (dots need dims >= 16).
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels import chunk_math as cm


class TileTools(NamedTuple):
  """What the SDM kernels (forward and backward) use on one value tile of bv columns of a chunk:
  row: [C, bv] row numbers; at_rows(idx): the indexer of the table rows at a vector of slot indices (both
  indexers arrays: a gather); dot: near-fp32 products; barrier: between a program's row reads and writes
  (the interpreter runs a program's memory operations in order; on the GPU the warps need it)."""
  row: jax.Array
  at_rows: Callable
  dot: Callable
  barrier: Callable


def tile_tools(C, bv, interpret):
  cols = cm.iota((1, bv), 1)
  return TileTools(row=cm.iota((C, bv), 0), at_rows=lambda idx: (idx[:, None], cols),
                   dot=functools.partial(cm.dot, precision=cm.precisions(jnp.float32, interpret).near),
                   barrier=(lambda: None) if interpret else pltriton.debug_barrier)


def token_loop(C, body, carry, unroll):
  """fori_loop over C tokens, `unroll` of them per step (Triton's lowering has no unroll of its own)."""
  def step(i, carry):
    for j in range(unroll):
      carry = body(i * unroll + j, carry)
    return carry

  return jax.lax.fori_loop(0, C // unroll, step, carry)


def _kernel(k_idx_ref, q_idx_ref, r0_coef_ref, read_coef_ref, solve_ref, aqk_ref, keep_ref, slot_write_ref,
            first_ref, v_ref, table_in_ref, table_ref, o_ref, *rows_ref, num_chunks, unroll, interpret):
  del table_in_ref  # aliased with table_ref
  f32 = jnp.float32
  C = solve_ref.shape[-1]
  bv = v_ref.shape[-1]
  row, at_rows, dot, barrier = tile_tools(C, bv, interpret)

  def chunk(n, carry):
    def read(t, acc):
      r0, o_read = acc
      rows_k = table_ref[at_rows(k_idx_ref[n, t, :])]
      if rows_ref:
        rows_ref[0][n, t] = rows_k
      r0_t = jnp.sum(r0_coef_ref[n, t, :][:, None] * rows_k, axis=0, keepdims=True)
      o_t = jnp.sum(read_coef_ref[n, t, :][:, None] * table_ref[at_rows(q_idx_ref[n, t, :])], axis=0, keepdims=True)
      return jnp.where(row == t, r0_t, r0), jnp.where(row == t, o_t, o_read)

    zeros = jnp.zeros((C, bv), f32)
    r0, o_read = token_loop(C, read, (zeros, zeros), unroll)
    delta = dot(solve_ref[n], v_ref[n].astype(f32) - r0)
    o_ref[n] = (o_read + dot(aqk_ref[n], delta)).astype(o_ref.dtype)
    barrier()

    def write(t, carry):
      rows = at_rows(k_idx_ref[n, t, :])
      new = keep_ref[n, t, :][:, None] * table_ref[rows] + dot(slot_write_ref[n, t], delta)
      barrier()  # a slot listed twice in token t: every copy reads the row before any copy rewrites it
      pltriton.store(table_ref.at[rows], new, mask=jnp.broadcast_to(first_ref[n, t, :][:, None] > 0, new.shape))
      return carry

    token_loop(C, write, 0, unroll)
    barrier()
    return carry

  jax.lax.fori_loop(0, num_chunks, chunk, 0)


@functools.partial(jax.jit, static_argnames=("save_rows", "block_v", "num_warps", "num_stages", "unroll", "interpret"))
def sparse_delta_fwd(table, k_idx, q_idx, r0_coef, read_coef, solve, a_qk, keep, slot_write, first, v, *,
                     save_rows=True, block_v=64, num_warps=4, num_stages=1, unroll=1, interpret=False):
  """Returns (final table [B, H, N, V] fp32, o [B, H, Nc, C, V] in v.dtype) and with save_rows the rows the
  backward needs, rows [B, H, Nc, C, W, V] fp32: the chunk-start rows at k_idx (T x W x V per head, the
  largest array of the op: a forward without a gradient leaves them out). Launch settings (the defaults untimed
  against others; benchmarks/scripts/probe_sdm_kernels.py times them): block_v value columns per program,
  num_warps, num_stages (Triton pipelining of the token loops) and unroll (tokens per step of those loops, so
  that several tokens' independent row gathers are in flight at once)."""
  B, H, N, V = table.shape
  _, _, Nc, C, W = k_idx.shape
  R = q_idx.shape[-1]
  block_v = min(block_v, V)
  if unroll < 1 or C % unroll:
    raise ValueError(f"unroll: expected a divisor of the chunk size {C}, got {unroll}")
  sq = pl.squeezed
  per_head = lambda *shape: pl.BlockSpec((sq, sq, *shape), lambda b, h, j: (b, h) + (0,) * len(shape))
  tile = lambda *shape: pl.BlockSpec((sq, sq, *shape, block_v), lambda b, h, j: (b, h) + (0,) * len(shape) + (j,))
  out_shape = [jax.ShapeDtypeStruct(table.shape, jnp.float32), jax.ShapeDtypeStruct((B, H, Nc, C, V), v.dtype)]
  out_specs = [tile(N), tile(Nc, C)]
  if save_rows:
    out_shape.append(jax.ShapeDtypeStruct((B, H, Nc, C, W, V), jnp.float32))
    out_specs.append(tile(Nc, C, W))
  return pl.pallas_call(
      functools.partial(_kernel, num_chunks=Nc, unroll=unroll, interpret=interpret),
      out_shape=tuple(out_shape),
      grid=(B, H, V // block_v),
      in_specs=[per_head(Nc, C, W), per_head(Nc, C, R), per_head(Nc, C, W), per_head(Nc, C, R), per_head(Nc, C, C),
                per_head(Nc, C, C), per_head(Nc, C, W), per_head(Nc, C, W, C), per_head(Nc, C, W), tile(Nc, C),
                tile(N)],
      out_specs=tuple(out_specs),
      input_output_aliases={10: 0},
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="sparse_delta_fwd",
  )(k_idx, q_idx, r0_coef, read_coef, solve, a_qk, keep, slot_write, first, v, table)
