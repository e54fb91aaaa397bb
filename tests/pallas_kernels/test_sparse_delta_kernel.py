"""The Pallas Sparse Delta Memory kernel: a 'cuda' lowering check for an abstract NVIDIA H200 (its
interpret-mode numerics, forward and gradients, are in tests/ops/test_sparse_delta.py)."""

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.sparse_delta import sparse_delta_fwd


@pytest.mark.parametrize("W,C", [(16, 16), (128, 16), (16, 32)])
def test_lowers_for_cuda(W, C):
  B, H, N, V, Nc, R = 1, 2, 1024, 128, 2, W
  f32 = jnp.float32
  spec = lambda *shape, d=f32: jax.ShapeDtypeStruct(shape, d)
  chunked = lambda *shape, d=f32: spec(B, H, Nc, C, *shape, d=d)
  args = (spec(B, H, N, V), chunked(W, d=jnp.int32), chunked(R, d=jnp.int32), chunked(W), chunked(R), chunked(C),
          chunked(C), chunked(W), chunked(W, C), chunked(W), chunked(V, d=jnp.bfloat16))
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    text = jax.jit(sparse_delta_fwd).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1
