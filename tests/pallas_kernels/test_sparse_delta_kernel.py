"""The Pallas Sparse Delta Memory kernel: a 'cuda' lowering check for an abstract NVIDIA H200 (its
interpret-mode numerics, forward and gradients, are in tests/ops/test_sparse_delta.py)."""

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.sparse_delta import sparse_delta_fwd


@pytest.mark.parametrize("W,C,save_rows", [(16, 16, True), (128, 16, True), (16, 32, True), (16, 16, False)])
def test_lowers_for_cuda(W, C, save_rows):
  B, H, N, V, Nc, R = 1, 2, 1024, 128, 2, W
  f32 = jnp.float32
  spec = lambda *shape, d=f32: jax.ShapeDtypeStruct(shape, d)
  chunked = lambda *shape, d=f32: spec(B, H, Nc, C, *shape, d=d)
  args = (spec(B, H, N, V), chunked(W, d=jnp.int32), chunked(R, d=jnp.int32), chunked(W), chunked(R), chunked(C),
          chunked(C), chunked(W), chunked(W, C), chunked(W), chunked(V, d=jnp.bfloat16))
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    fwd = jax.jit(lambda *a: sparse_delta_fwd(*a, save_rows=save_rows))
    text = fwd.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1


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
