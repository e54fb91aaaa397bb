"""The Pallas Sparse Delta Memory kernels: 'cuda' lowering checks for an abstract NVIDIA H200 (their
interpret-mode numerics, forward and gradients, are in tests/ops/test_sparse_delta.py)."""

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.sparse_delta import sparse_delta_fwd
from pallas_kernels.sparse_delta_bwd import sparse_delta_bwd

from lowering import TRITON_CALL, lower_for_h200


B, H, N, V, NUM_CHUNKS = 1, 2, 1024, 128, 2
TABLE = jax.ShapeDtypeStruct((B, H, N, V), jnp.float32)


def _chunked(C, *shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct((B, H, NUM_CHUNKS, C, *shape), dtype)


def _lowers_for_cuda(kernel, args):
  return lower_for_h200(kernel, *args).count(TRITON_CALL) == 1


@pytest.mark.parametrize("W,C,save_rows", [(16, 16, True), (128, 16, True), (16, 32, True), (16, 16, False)])
def test_lowers_for_cuda(W, C, save_rows):
  R = W
  x = lambda *shape, dtype=jnp.float32: _chunked(C, *shape, dtype=dtype)
  args = (TABLE, x(W, dtype=jnp.int32), x(R, dtype=jnp.int32), x(W), x(R), x(C), x(C), x(W), x(W, C), x(W),
          x(V, dtype=jnp.bfloat16))
  assert _lowers_for_cuda(lambda *a: sparse_delta_fwd(*a, save_rows=save_rows), args)


@pytest.mark.parametrize("W,C", [(16, 16), (128, 16), (16, 32)])
def test_backward_lowers_for_cuda(W, C):
  R = W
  x = lambda *shape, dtype=jnp.float32: _chunked(C, *shape, dtype=dtype)
  args = (TABLE, TABLE, x(W, dtype=jnp.int32), x(R, dtype=jnp.int32), x(W), x(C), x(C), x(W), x(W), x(W), x(W), x(R),
          x(W, V), x(V, dtype=jnp.bfloat16), x(V, dtype=jnp.bfloat16))
  assert _lowers_for_cuda(sparse_delta_bwd, args)


def test_forward_without_gradient_leaves_out_the_saved_rows():
  """The rows the backward needs (T x W x V per head, the op's largest array) are written only when a
  gradient is taken: a forward-only trace has no array of their shape, a gradient trace has one."""
  from sdm_jax.ops.sparse_pallas import sparse_delta_pallas
  B, T, H, N, V, W, C = 1, 48, 1, 64, 32, 16, 16
  f32 = lambda *shape: jnp.zeros(shape, jnp.float32)
  idx = jnp.zeros((B, T, H, W), jnp.int32)
  gate = f32(B, T, H)
  run = lambda table: sparse_delta_pallas(table, idx, f32(B, T, H, W), f32(B, T, H, V), gate, gate, idx,
                                          f32(B, T, H, W), C)
  rows = f"f32[{B},{H},{T // C},{C},{W},{V}]"
  table = f32(B, H, N, V)
  assert rows not in str(jax.make_jaxpr(run)(table))
  assert rows in str(jax.make_jaxpr(jax.grad(lambda m: jnp.sum(run(m)[0])))(table))


@pytest.mark.parametrize("block_v,num_warps,num_stages,unroll", [(16, 4, 2, 1), (32, 8, 1, 4), (64, 2, 2, 2)])
def test_launch_settings_lower_for_cuda(block_v, num_warps, num_stages, unroll):
  W = R = C = 16
  x = lambda *shape, dtype=jnp.float32: _chunked(C, *shape, dtype=dtype)
  args = (TABLE, x(W, dtype=jnp.int32), x(R, dtype=jnp.int32), x(W), x(R), x(C), x(C), x(W), x(W, C), x(W),
          x(V, dtype=jnp.bfloat16))
  assert _lowers_for_cuda(lambda *a: sparse_delta_fwd(*a, save_rows=False, block_v=block_v, num_warps=num_warps,
                                                      num_stages=num_stages, unroll=unroll), args)


def test_unrolled_token_loops_give_the_same_result():
  """unroll only changes how many tokens one loop step covers: in interpret mode the results are identical."""
  from sdm_jax.evaluation.sdm_bench import sdm_inputs
  from sdm_jax.ops.sparse_pallas import kernel_inputs
  B, T, H, N, V, W, C = 1, 32, 2, 64, 32, 16, 16
  fl, it = sdm_inputs(B, T, H, N, V, W, W, 0)
  table = jnp.broadcast_to(fl["m0"], (B, H, N, V))
  args = kernel_inputs(it["k_idx"], fl["k_w"], fl["v"].astype(jnp.float32), fl["g"], fl["beta"], it["q_idx"],
                       fl["q_w"], C)[0]
  base, unrolled = (sparse_delta_fwd(table, *args, block_v=16, unroll=unroll, interpret=True) for unroll in (1, 4))
  for a, b in zip(base, unrolled):
    assert jnp.array_equal(a, b)
  with pytest.raises(ValueError, match="unroll"):
    sparse_delta_fwd(table, *args, unroll=3, interpret=True)
