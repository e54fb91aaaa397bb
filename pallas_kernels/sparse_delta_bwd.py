"""Pallas (Triton) backward kernel of the chunked Sparse Delta Memory update (SPEC.md section 3).

The forward's chunk (one value tile): r0 = sum_w r0_coef * rows_k, Delta = solve (v - r0),
o = sum_r read_coef * rows_q + A_qk Delta, and at the chunk end a written slot holds keep * (its
chunk-start row) + sum over its entries (s, w) of write_coef[s, w] Delta_s. Walking the chunks in
reverse with the table cotangent dM (d_end -> d_start in place), per chunk:
  1. undo the chunk's writes from the saved rows (the table becomes the chunk-start table);
     r0 and Delta as in the forward;
  2. with d_slot = d_end at k_idx and rows_q the chunk-start rows at q_idx:
     dDelta = A_qk^T dO + sum_w write_coef * d_slot, dv = solve^T dDelta, dr0 = -dv, and the
     coefficients' cotangents (per value tile; the caller sums the tiles and divides d_keep by the
     multiplicity, since one kept value is shared by a slot's entries);
  3. dM at the chunk start: written slots keep * d_end (scaled once, by the first token that writes
     the slot), then every token adds r0_coef dr0 at k_idx and read_coef dO at q_idx.
Step 3 updates rows that repeat within a token and across tokens. The interpreter's atomic_add
loses repeated rows of one call, so each token instead reads its rows, waits for every thread to
have read (barrier), writes and waits again; a slot listed twice in a token carries the token's
summed coefficient (slot_r0_coef, slot_read_coef) so that its entries write the same value.
Shapes ([B, H, Nc, C, ...]): k_idx, first, keep, r0_coef, slot_r0_coef, write_coef [.., W];
q_idx, slot_read_coef [.., R]; solve, a_qk [.., C]; rows [.., W, V]; v, d_o [.., V];
table, d_table [B, H, N, V] fp32. W, R, C >= 16 and V a multiple of block_v.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.sparse_delta import tile_tools


def _kernel(k_idx_ref, q_idx_ref, r0_coef_ref, solve_ref, aqk_ref, keep_ref, first_ref, write_coef_ref, slot_r0_ref,
            slot_read_ref, rows_ref, v_ref, d_o_ref, table_in_ref, d_table_in_ref, table_ref, d_table_ref, d_v_ref,
            d_r0_coef_ref, d_read_coef_ref, d_solve_ref, d_aqk_ref, d_keep_ref, d_write_coef_ref, *, num_chunks,
            interpret):
  del table_in_ref, d_table_in_ref  # aliased with table_ref, d_table_ref
  f32 = jnp.float32
  C = solve_ref.shape[-1]
  bv = v_ref.shape[-1]
  row, at_rows, dot, barrier = tile_tools(C, bv, interpret)
  row_of = lambda x, t: jnp.sum(jnp.where(row == t, x, 0.0), axis=0, keepdims=True)  # [C, bv] -> [1, bv]

  def accumulate(rows, update):
    old = d_table_ref[rows]
    barrier()  # every thread has read before any writes: repeated rows read the same value
    d_table_ref[rows] = update(old)
    barrier()

  def chunk(i, carry):
    n = num_chunks - 1 - i

    def undo(t, r0):
      rows_k = rows_ref[n, t]
      table_ref[at_rows(k_idx_ref[n, t, :])] = rows_k
      r0_t = jnp.sum(r0_coef_ref[n, t, :][:, None] * rows_k, axis=0, keepdims=True)
      return jnp.where(row == t, r0_t, r0)

    r0 = jax.lax.fori_loop(0, C, undo, jnp.zeros((C, bv), f32))
    v_r0 = v_ref[n].astype(f32) - r0
    delta = dot(solve_ref[n], v_r0)
    d_o = d_o_ref[n].astype(f32)
    barrier()

    def read(t, d_delta):
      d_slot = d_table_ref[at_rows(k_idx_ref[n, t, :])]
      rows_q = table_ref[at_rows(q_idx_ref[n, t, :])]
      d_write_coef_ref[n, t] = jnp.sum(d_slot * row_of(delta, t), axis=1)
      d_keep_ref[n, t] = jnp.sum(d_slot * rows_ref[n, t], axis=1)
      d_read_coef_ref[n, t] = jnp.sum(rows_q * row_of(d_o, t), axis=1)
      d_delta_t = jnp.sum(write_coef_ref[n, t, :][:, None] * d_slot, axis=0, keepdims=True)
      return d_delta + jnp.where(row == t, d_delta_t, 0.0)

    d_delta = jax.lax.fori_loop(0, C, read, dot(aqk_ref[n].T, d_o))
    d_v = dot(solve_ref[n].T, d_delta)
    d_v_ref[n] = d_v
    d_solve_ref[n] = dot(d_delta, v_r0.T)
    d_aqk_ref[n] = dot(d_o, delta.T)
    barrier()

    def write_rows(t, carry):  # keep (once per slot) and r0_coef dr0, the cotangent of the rows r0 read
      d_r0_t = -row_of(d_v, t)
      d_r0_coef_ref[n, t] = jnp.sum(rows_ref[n, t] * d_r0_t, axis=1)
      scale = jnp.where(first_ref[n, t, :] > 0, keep_ref[n, t, :], 1.0)[:, None]
      accumulate(at_rows(k_idx_ref[n, t, :]), lambda d: scale * d + slot_r0_ref[n, t, :][:, None] * d_r0_t)
      return carry

    def read_rows(t, carry):  # read_coef dO, the cotangent of the rows o read
      d_o_t = row_of(d_o, t)
      accumulate(at_rows(q_idx_ref[n, t, :]), lambda d: d + slot_read_ref[n, t, :][:, None] * d_o_t)
      return carry

    jax.lax.fori_loop(0, C, write_rows, 0)
    jax.lax.fori_loop(0, C, read_rows, 0)
    return carry

  jax.lax.fori_loop(0, num_chunks, chunk, 0)


@functools.partial(jax.jit, static_argnames=("block_v", "num_warps", "num_stages", "interpret"))
def sparse_delta_bwd(table, d_table, k_idx, q_idx, r0_coef, solve, a_qk, keep, first, write_coef, slot_r0_coef,
                     slot_read_coef, rows, v, d_o, *, block_v=64, num_warps=4, num_stages=1, interpret=False):
  """table: the final table, d_table: its cotangent (both overwritten in place). Returns (the initial
  table, its cotangent d_table [B, H, N, V], d_v [B, H, Nc, C, V] fp32, and per value tile
  [B, H, V / block_v, Nc, C, ...]: d_r0_coef [W], d_read_coef [R], d_solve [C], d_a_qk [C], d_keep [W]
  (not yet divided by the multiplicity), d_write_coef [W]). Launch settings as in `sparse_delta_fwd`."""
  B, H, N, V = table.shape
  _, _, Nc, C, W = k_idx.shape
  R = q_idx.shape[-1]
  block_v = min(block_v, V)
  nv = V // block_v
  sq = pl.squeezed
  per_head = lambda *shape: pl.BlockSpec((sq, sq, *shape), lambda b, h, j: (b, h) + (0,) * len(shape))
  tile = lambda *shape: pl.BlockSpec((sq, sq, *shape, block_v), lambda b, h, j: (b, h) + (0,) * len(shape) + (j,))
  per_tile = lambda *shape: pl.BlockSpec((sq, sq, sq, *shape), lambda b, h, j: (b, h, j) + (0,) * len(shape))
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  tiles = lambda *shape: f32(B, H, nv, Nc, C, *shape)
  return pl.pallas_call(
      functools.partial(_kernel, num_chunks=Nc, interpret=interpret),
      out_shape=(f32(B, H, N, V), f32(B, H, N, V), f32(B, H, Nc, C, V), tiles(W), tiles(R), tiles(C), tiles(C),
                 tiles(W), tiles(W)),
      grid=(B, H, nv),
      in_specs=[per_head(Nc, C, W), per_head(Nc, C, R), per_head(Nc, C, W), per_head(Nc, C, C), per_head(Nc, C, C),
                per_head(Nc, C, W), per_head(Nc, C, W), per_head(Nc, C, W), per_head(Nc, C, W), per_head(Nc, C, R),
                tile(Nc, C, W), tile(Nc, C), tile(Nc, C), tile(N), tile(N)],
      out_specs=(tile(N), tile(N), tile(Nc, C), per_tile(Nc, C, W), per_tile(Nc, C, R), per_tile(Nc, C, C),
                 per_tile(Nc, C, C), per_tile(Nc, C, W), per_tile(Nc, C, W)),
      input_output_aliases={13: 0, 14: 1},
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="sparse_delta_bwd",
  )(k_idx, q_idx, r0_coef, solve, a_qk, keep, first, write_coef, slot_r0_coef, slot_read_coef, rows, v, d_o, table,
    d_table)
