"""The Pallas backward kernels and the forward's saving variants: a 'cuda' lowering check for an
abstract NVIDIA H200, also with packed documents (interpret-mode numerics of the backward are in tests/ops, through
impl="pallas", packed ones in tests/ops/test_packed.py)."""

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.delta_rule_bwd import intra_chunk_bwd, state_pass_bwd
from pallas_kernels.delta_rule_fwd import ChunkTensors, StatePassSettings, chunk_cumsum, intra_chunk, state_pass

from lowering import TRITON_CALL, lower_for_h200


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_forward_with_residuals_and_backward_lower_for_cuda(dtype, chunk_size):
  B, T, H, K, V = 1, 2 * chunk_size, 2, 128, 64
  N = T // chunk_size
  spec = lambda *shape, d=dtype: jax.ShapeDtypeStruct(shape, d)
  f32 = jnp.float32
  key, value, chunk = spec(B, T, H, K), spec(B, T, H, V), spec(B, T, H, chunk_size)
  chunks = ChunkTensors(Y=key, U=value, Aqk=chunk, q_decayed=key, u_decayed=key, decay_last=spec(B, N, H, K, d=f32))
  kw = dict(chunk_size=chunk_size)
  kernels = [  # (function, arguments, its Triton launches)
      (lambda q, u, e, z, G: intra_chunk(q, (u, z, e), G, save_inverse=True, scale=0.1, **kw),
       (key, key, key, value, spec(B, T, H, K, d=f32)), 2),
      (lambda *a: state_pass(*a, save_states=True, **kw), (chunks, spec(B, H, K, V, d=f32)), 1),
      (lambda *a: state_pass_bwd(*a, **kw), (chunks, value, spec(B, H, K, V, d=f32)), 1),
      (lambda *a: intra_chunk_bwd(*a, scale=0.1, **kw),
       (key, key, key, value, spec(B, T, H, K, d=f32), spec(B, T, H, V, d=f32), spec(B, T, H, chunk_size, d=f32),
        spec(B, H, N, K, V, d=f32), spec(B, H, N, K, V, d=f32), value, spec(B, T, H, V, d=f32)), 2),
  ]
  for fn, args, launches in kernels:
    assert lower_for_h200(fn, *args).count(TRITON_CALL) == launches


@pytest.mark.parametrize("dtype,scalar_decay", [(jnp.float32, False), (jnp.bfloat16, False), (jnp.bfloat16, True)])
def test_packed_kernels_lower_for_cuda(dtype, scalar_decay):
  """The per-chunk kernels with the documents of packed sequences (their optional [B, T] int32 input), and the
  cumsum with its keep mask."""
  B, T, H, K, V, C = 1, 64, 2, 128, 64, 32
  N = T // C
  spec = lambda *shape, d=dtype: jax.ShapeDtypeStruct(shape, d)
  f32 = jnp.float32
  key, value, documents = spec(B, T, H, K), spec(B, T, H, V), spec(B, T, d=jnp.int32)
  forward = lambda q, u, e, z, G, d: intra_chunk(q, (u, z, e), G, save_inverse=True, scale=0.1, chunk_size=C,
                                                 scalar_decay=scalar_decay, documents=d)
  assert lower_for_h200(forward, key, key, key, value, spec(B, T, H, K, d=f32), documents).count(TRITON_CALL) == 2
  backward = lambda *a: intra_chunk_bwd(*a[:-1], scale=0.1, chunk_size=C, documents=a[-1])
  args = (key, key, key, value, spec(B, T, H, K, d=f32), spec(B, T, H, V, d=f32), spec(B, T, H, C, d=f32),
          spec(B, H, N, K, V, d=f32), spec(B, H, N, K, V, d=f32), value, spec(B, T, H, V, d=f32), documents)
  assert lower_for_h200(backward, *args).count(TRITON_CALL) == 2
  cumsum = lambda g, keep: chunk_cumsum(g, C, keep=keep)  # the decay's keep mask, the same [B, T] int32 input
  assert lower_for_h200(cumsum, spec(B, T, H, K, d=f32), documents).count(TRITON_CALL) == 1


H200 = 232_448  # bytes of shared memory per program (compute capability 9.0)


@pytest.mark.parametrize("chunk_size,dtype,block_v,want", [
    (32, jnp.bfloat16, 32, 3), (64, jnp.bfloat16, 32, 3), (64, jnp.bfloat16, 16, 3),  # ran on the H200 at 3 stages
    # asked 282,624 bytes at 2 stages / 286,720 at 3 there: compile failures (session 8)
    (128, jnp.bfloat16, 32, 1), (64, jnp.float32, 16, 1),
])
def test_state_stages_fit_the_shared_memory_measured_on_the_h200(chunk_size, dtype, block_v, want):
  rule = lambda **kw: StatePassSettings.for_shape(chunk_size, 4, 16, 128, 128, dtype, block_v=block_v,
                                                  shared_memory=H200, **kw)
  assert rule().num_stages == want
  assert rule(num_stages=2).num_stages == 2  # asked for: kept
