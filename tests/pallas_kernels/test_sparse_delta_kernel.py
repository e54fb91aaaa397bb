"""The Pallas Sparse Delta Memory kernels: 'cuda' lowering checks for an abstract NVIDIA H200 (their
interpret-mode numerics, forward and gradients, are in tests/ops/test_sparse_delta.py and, packed,
tests/ops/test_sparse_packed.py)."""

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.sparse_tokens import sparse_tokens_bwd, sparse_tokens_fwd

from sdm_jax.testing.inputs import sdm_inputs
from sdm_jax.testing.lowering import TRITON_CALL, lower_for_h200

B, H, N, V = 1, 2, 1024, 128
TABLE = jax.ShapeDtypeStruct((B, H, N, V), jnp.float32)
JAXPR_DTYPES = {"float32": "f32", "bfloat16": "bf16"}  # how a jaxpr prints them


def _per_token(T, *shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct((B, H, T, *shape), dtype)


def _forward_args(T, W):
  x = lambda *shape, dtype=jnp.float32: _per_token(T, *shape, dtype=dtype)
  return (TABLE, x(W, dtype=jnp.int32), x(W), x(W), x(), x(), x(V, dtype=jnp.bfloat16), x(W, dtype=jnp.int32), x(W))


def _lowers_for_cuda(kernel, args):
  return lower_for_h200(kernel, *args).count(TRITON_CALL) == 1


@pytest.mark.parametrize("W,T,save_rows,rows_dtype,rows_from", [
    (16, 16, True, jnp.float32, 0), (128, 37, True, jnp.float32, 0), (16, 37, False, jnp.float32, 0),
    (128, 37, True, jnp.bfloat16, 0), (16, 37, True, jnp.float32, 20), (128, 16, True, jnp.bfloat16, 5)])
def test_lowers_for_cuda(W, T, save_rows, rows_dtype, rows_from):
  assert _lowers_for_cuda(lambda *a: sparse_tokens_fwd(*a, save_rows=save_rows, rows_dtype=rows_dtype,
                                                       rows_from=rows_from), _forward_args(T, W))


@pytest.mark.parametrize("W,T,rows_dtype", [(16, 16, jnp.float32), (128, 37, jnp.float32), (128, 37, jnp.bfloat16)])
def test_backward_lowers_for_cuda(W, T, rows_dtype):
  x = lambda *shape, dtype=jnp.float32: _per_token(T, *shape, dtype=dtype)
  idx = x(W, dtype=jnp.int32)
  args = (TABLE, TABLE, idx, x(W), x(W), x(W), x(), x(), x(V), idx, x(W), x(W), x(W, V, dtype=rows_dtype), x(V))
  assert _lowers_for_cuda(sparse_tokens_bwd, args)


def test_bf16_table_lowers_for_cuda():
  """table_dtype="bfloat16" (sparse_delta_rule): the table in bf16 through both kernels, the rows saved in bf16."""
  table = jax.ShapeDtypeStruct((B, H, N, V), jnp.bfloat16)
  forward = lambda *a: sparse_tokens_fwd(*a, rows_dtype=jnp.bfloat16)
  assert _lowers_for_cuda(forward, (table, *_forward_args(37, 128)[1:]))
  x = lambda *shape, dtype=jnp.float32: _per_token(37, *shape, dtype=dtype)
  idx = x(128, dtype=jnp.int32)
  args = (table, TABLE, idx, x(128), x(128), x(128), x(), x(), x(V), idx, x(128), x(128), x(128, V, dtype=jnp.bfloat16),
          x(V))
  assert _lowers_for_cuda(sparse_tokens_bwd, args)
  assert _lowers_for_cuda(sparse_tokens_bwd, (table, table, *args[2:]))  # table_grad_dtype="bfloat16": dM in bf16


@pytest.mark.parametrize("shared,table_dtype,rows_dtype,rows_from,save_rows", [
    (True, jnp.float32, jnp.float32, 0, True), (False, jnp.float32, jnp.bfloat16, 5, True),
    (True, jnp.bfloat16, jnp.bfloat16, 20, True), (True, jnp.bfloat16, jnp.float32, 0, False)])
def test_packed_lowers_for_cuda(shared, table_dtype, rows_dtype, rows_from, save_rows):
  """The packed variants (m0 given, DESIGN.md section 9): coded indices, rows loaded from the table or m0 under
  masks, the rows read saved too, and the backward without a table (from the saved rows) with its masked dM0
  updates, m0 shared over the batch or per row, with a bf16 table (and bf16 dM and m0, as `sparse_pallas` passes
  it), from a later token, and the forward that saves nothing."""
  T, W = 37, 128
  m0 = jax.ShapeDtypeStruct((H, N, V) if shared else (B, H, N, V), table_dtype)
  table = jax.ShapeDtypeStruct((B, H, N, V), table_dtype)
  forward = lambda m, *a: sparse_tokens_fwd(None, *a, m0=m, table_dtype=table_dtype, save_rows=save_rows,
                                            rows_dtype=rows_dtype, rows_from=rows_from)  # packed: no table in
  assert _lowers_for_cuda(forward, (m0, *_forward_args(T, W)[1:]))
  L = T - rows_from
  x = lambda *shape, dtype=jnp.float32: _per_token(L, *shape, dtype=dtype)
  idx = x(W, dtype=jnp.int32)
  rows = jax.ShapeDtypeStruct((B, H, L, W, V), rows_dtype)
  reads = jax.ShapeDtypeStruct((B, H, L, W, V), rows_dtype)  # R = W here
  d_table = table  # a bf16 table with its dM in bf16 too (table_grad_dtype), dM0 fp32
  args = (d_table, idx, x(W), x(W), x(W), x(), x(), x(V), idx, x(W), x(W), rows, x(V))
  backward = lambda reads, d_m0, *a: sparse_tokens_bwd(None, *a, reads=reads, d_m0=d_m0)
  assert _lowers_for_cuda(backward, (reads, TABLE, *args))


def test_forward_takes_the_table_or_m0():
  T, W = 4, 16
  x = lambda *shape, dtype=jnp.float32: jnp.zeros((B, H, T, *shape), dtype)
  idx, table = x(W, dtype=jnp.int32), jnp.zeros(TABLE.shape)
  args = (idx, x(W), x(W), x(), x(), x(V), idx, x(W))
  for table_arg, m0, dtype in ((table, table[0], None), (None, None, None), (table, None, "float32")):
    with pytest.raises(ValueError, match="a table .unpacked. or m0 and optionally table_dtype .packed."):
      sparse_tokens_fwd(table_arg, *args, m0=m0, table_dtype=dtype, interpret=True)


def test_backward_takes_the_table_or_reads_and_d_m0():
  T, W = 4, 16
  x = lambda *shape, dtype=jnp.float32: jnp.zeros((B, H, T, *shape), dtype)
  idx, table = x(W, dtype=jnp.int32), jnp.zeros(TABLE.shape)
  args = (idx, x(W), x(W), x(W), x(), x(), x(V), idx, x(W), x(W), x(W, V), x(V))
  reads = x(W, V)
  for table_arg, packed in ((table, {"d_m0": table}), (None, {"reads": reads}), (None, {}),
                            (table, {"reads": reads, "d_m0": table})):
    with pytest.raises(ValueError, match="table, reads and d_m0"):
      sparse_tokens_bwd(table_arg, table, *args, **packed)


@pytest.mark.parametrize("block_v,num_warps,num_stages", [(8, 2, 1), (32, 8, 2), (64, 4, 1)])
def test_forward_pipeline_stages_lower_for_cuda(block_v, num_warps, num_stages):
  assert _lowers_for_cuda(lambda *a: sparse_tokens_fwd(*a, save_rows=False, block_v=block_v, num_warps=num_warps,
                                                       num_stages=num_stages), _forward_args(16, 16))


@pytest.mark.parametrize("block_v", [8, 32])
def test_value_tiles_give_the_same_result(block_v):
  """Columns are independent: any value tile gives the same forward, bit for bit, in interpret mode."""
  from sdm_jax.ops.sparse_pallas import _forward_args
  T, N, V, W = 24, 64, 64, 16
  fl, it = sdm_inputs(1, T, 2, N, V, W, W, 0)
  table = jnp.broadcast_to(fl["m0"], (1, 2, N, V))
  args = _forward_args(it["k_idx"], fl["k_w"], fl["v"], fl["g"], fl["beta"], it["q_idx"], fl["q_w"])
  base, tiled = (sparse_tokens_fwd(table, *args, block_v=bv, interpret=True) for bv in (V, block_v))
  for a, b in zip(base, tiled):
    assert jnp.array_equal(a, b)


@pytest.mark.parametrize("block_v", [8, 32])
def test_backward_value_tiles_give_the_same_result(block_v):
  """The backward per value tile: the tables and d_v bit for bit, the
  per-tile partial sums summed to the one tile's (interpret mode; N small, so slots repeat and read slots are written
  at the same token)."""
  import numpy as np
  from sdm_jax.ops.sparse_pallas import _forward_args, _heads, _slot_groups, _summed_within_token, read_at_writes
  T, N, V, W = 24, 32, 64, 16
  fl, it = sdm_inputs(1, T, 2, N, V, W, W, 2)
  table = jnp.broadcast_to(fl["m0"], (1, 2, N, V))
  k_idx, k_w, k_slot, decay, beta, v, q_idx, q_w = _forward_args(it["k_idx"], fl["k_w"], fl["v"], fl["g"],
                                                                 fl["beta"], it["q_idx"], fl["q_w"])
  final, _, rows = sparse_tokens_fwd(table, k_idx, k_w, k_slot, decay, beta, v, q_idx, q_w, interpret=True)
  k_first = _heads(_slot_groups(it["k_idx"])[1].astype(jnp.float32))
  q_slot = _summed_within_token(it["q_idx"], fl["q_w"])
  k_read = _heads(read_at_writes(it["k_idx"], it["q_idx"], q_slot))
  q_slot = _heads(q_slot)
  rng = np.random.default_rng(3)
  d_table = jnp.asarray(rng.standard_normal(table.shape), jnp.float32)
  d_o = jnp.asarray(rng.standard_normal(v.shape), jnp.bfloat16)
  base, tiled = (sparse_tokens_bwd(final, d_table, k_idx, k_w, k_slot, k_first, decay, beta, v, q_idx, q_slot, k_read,
                                   rows, d_o, block_v=bv, interpret=True) for bv in (V, block_v))
  for a, b in zip(base[:3], tiled[:3]):
    assert jnp.array_equal(a, b)
  for a, b in zip(base[3:], tiled[3:]):
    np.testing.assert_allclose(jnp.sum(b, axis=2), jnp.sum(a, axis=2), rtol=1e-5, atol=1e-6)


def test_rows_from_and_rows_dtype_select_the_saved_rows():
  """rows_from saves the rows of the later tokens only, rows_dtype rounds them; the table and o do not change."""
  from sdm_jax.ops.sparse_pallas import _forward_args
  T, N, V, W = 24, 64, 32, 16
  fl, it = sdm_inputs(1, T, 2, N, V, W, W, 1)
  table = jnp.broadcast_to(fl["m0"], (1, 2, N, V))
  args = _forward_args(it["k_idx"], fl["k_w"], fl["v"], fl["g"], fl["beta"], it["q_idx"], fl["q_w"])
  final, o, rows = sparse_tokens_fwd(table, *args, interpret=True)
  for rows_from, rows_dtype in ((9, jnp.float32), (0, jnp.bfloat16), (23, jnp.bfloat16)):
    out = sparse_tokens_fwd(table, *args, rows_from=rows_from, rows_dtype=rows_dtype, interpret=True)
    assert jnp.array_equal(out[0], final) and jnp.array_equal(out[1], o)
    assert out[2].dtype == rows_dtype and jnp.array_equal(out[2], rows[:, :, rows_from:].astype(rows_dtype))


@pytest.mark.parametrize("rows_dtype,rows_segments,saved_tokens", [("float32", 1, 48), ("bfloat16", 1, 48),
                                                                   ("float32", 3, 16)])
def test_forward_without_gradient_leaves_out_the_saved_rows(rows_dtype, rows_segments, saved_tokens):
  """The rows the backward needs (T x W x V per head, the op's largest array) are written only when a
  gradient is taken: a forward-only trace has no array of their shape, a gradient trace has one, in rows_dtype,
  for the last segment's tokens."""
  from sdm_jax.ops.sparse_pallas import PallasConfig, sparse_delta_pallas
  B, T, H, N, V, W = 1, 48, 1, 64, 32, 16
  f32 = lambda *shape: jnp.zeros(shape, jnp.float32)
  idx = jnp.zeros((B, T, H, W), jnp.int32)
  gate = f32(B, T, H)
  config = PallasConfig(rows_dtype=rows_dtype, rows_segments=rows_segments)
  run = lambda table: sparse_delta_pallas(table, idx, f32(B, T, H, W), f32(B, T, H, V), gate, gate, idx,
                                          f32(B, T, H, W), config)
  rows = f"{JAXPR_DTYPES[rows_dtype]}[{B},{H},{saved_tokens},{W},{V}]"
  table = f32(H, N, V)
  assert rows not in str(jax.make_jaxpr(run)(table))
  assert rows in str(jax.make_jaxpr(jax.grad(lambda m: jnp.sum(run(m)[0])))(table))


@pytest.mark.parametrize("block_v,num_warps", [(16, 4), (32, 8), (128, 16)])
def test_launch_settings_lower_for_cuda(block_v, num_warps):
  """The launches `run_h200.sh sdm_launch` sweeps (sparse_delta_rule's launch option), forward and backward."""
  launch = dict(block_v=block_v, num_warps=num_warps)
  assert _lowers_for_cuda(lambda *a: sparse_tokens_fwd(*a, **launch), _forward_args(37, 128))
  x = lambda *shape, dtype=jnp.float32: _per_token(37, *shape, dtype=dtype)
  idx = x(128, dtype=jnp.int32)
  args = (TABLE, TABLE, idx, x(128), x(128), x(128), x(), x(), x(V), idx, x(128), x(128), x(128, V), x(V))
  assert _lowers_for_cuda(lambda *a: sparse_tokens_bwd(*a, **launch), args)
