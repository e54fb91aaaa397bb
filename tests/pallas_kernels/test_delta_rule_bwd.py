"""The Pallas backward kernels and the forward's saving variants: a 'cuda' lowering check for an
abstract NVIDIA H200, also with packed documents and with one decay per head (interpret-mode numerics of the backward
are in tests/ops, through impl="pallas", packed ones in tests/ops/test_packed.py; here the one-decay kernels against
the per-channel ones)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.chunk_math import lowest_bound
from pallas_kernels.delta_rule_bwd import intra_chunk_bwd, state_pass_bwd
from pallas_kernels.delta_rule_fwd import (ChunkTensors, StatePassSettings, chunk_cumsum, intra_chunk,
                                           saved_state_dtype, state_pass)
from pallas_kernels.launch import Shape
from sdm_jax.ops.segments import chunk_documents

from sdm_jax.testing.errors import relative_error
from sdm_jax.testing.lowering import TRITON_CALL, equations, lower_for_h200


@pytest.mark.parametrize("decay", ["channel", "head"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_forward_with_residuals_and_backward_lower_for_cuda(dtype, chunk_size, decay):
  """decay "head": G [B, T, H] and exp(G_C) [B, N, H], one decay per head (GDN); per channel also with a lower bound
  on g (gram_solve's and pair_bwd's two dots per gram at the lowest bound, one at half of it)."""
  B, T, H, K, V = 1, 2 * chunk_size, 2, 128, 64
  N = T // chunk_size
  spec = lambda *shape, d=dtype: jax.ShapeDtypeStruct(shape, d)
  f32 = jnp.float32
  per = (K,) if decay == "channel" else ()
  key, value, chunk = spec(B, T, H, K), spec(B, T, H, V), spec(B, T, H, chunk_size)
  states = spec(B, H, N, K, V, d=saved_state_dtype(dtype))
  chunks = ChunkTensors(Y=key, U=value, Aqk=chunk, q_decayed=key, u_decayed=key, decay_last=spec(B, N, H, *per, d=f32))
  kw = dict(chunk_size=chunk_size)
  kernels = [  # (function, arguments, its Triton launches)
      (lambda q, u, e, z, G: intra_chunk(q, (u, z, e), G, save_inverse=True, scale=0.1, **kw),
       (key, key, key, value, spec(B, T, H, *per, d=f32)), 2),
      (lambda *a: state_pass(*a, save_states=True, **kw), (chunks, spec(B, H, K, V, d=f32)), 1),
      (lambda *a: state_pass_bwd(*a, **kw), (chunks, value, spec(B, H, K, V, d=f32)), 1),
      (lambda *a: intra_chunk_bwd(*a, scale=0.1, **kw),
       (key, key, key, value, spec(B, T, H, *per, d=f32), spec(B, T, H, V, d=f32), spec(B, T, H, chunk_size, d=f32),
        states, states, value, spec(B, T, H, V, d=f32)), 2),
  ]
  for lower_bound in (lowest_bound(chunk_size), lowest_bound(chunk_size) / 2) if decay == "channel" else ():
    bounded = dict(lower_bound=lower_bound, **kw)
    kernels += [
        (lambda q, u, e, z, G, bounded=bounded: intra_chunk(q, (u, z, e), G, save_inverse=True, scale=0.1, **bounded),
         kernels[0][1], 2),
        (lambda *a, bounded=bounded: intra_chunk_bwd(*a, scale=0.1, **bounded), kernels[3][1], 2)]
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
  decays = spec(B, T, H, d=f32) if scalar_decay else spec(B, T, H, K, d=f32)  # G, and g for the cumsum
  forward = lambda q, u, e, z, G, d: intra_chunk(q, (u, z, e), G, save_inverse=True, scale=0.1, chunk_size=C,
                                                 documents=d)
  assert lower_for_h200(forward, key, key, key, value, decays, documents).count(TRITON_CALL) == 2
  backward = lambda *a: intra_chunk_bwd(*a[:-1], scale=0.1, chunk_size=C, documents=a[-1])
  states = spec(B, H, N, K, V, d=saved_state_dtype(dtype))
  args = (key, key, key, value, decays, spec(B, T, H, V, d=f32), spec(B, T, H, C, d=f32), states, states, value,
          spec(B, T, H, V, d=f32), documents)
  assert lower_for_h200(backward, *args).count(TRITON_CALL) == 2
  cumsum = lambda g, keep: chunk_cumsum(g, C, keep=keep)  # the decay's keep mask, the same [B, T] int32 input
  assert lower_for_h200(cumsum, decays, documents).count(TRITON_CALL) == 1


@pytest.mark.parametrize("decay,chunk_size,packed", [(0.05, 32, False), (30.0, 16, False), (1.0, 16, True)])
def test_one_decay_per_head_backward_matches_the_per_channel_kernels(decay, chunk_size, packed):
  """The backward kernels on G [B, T, H] (GDN: one decay per head, also in exp(G_C) [B, N, H]) give what the
  per-channel kernels give with that decay broadcast over K, dg summed over K; also with g down to -30 per step
  and with packed documents (interpret mode, fp32)."""
  B, H, K, V, C = 1, 2, 32, 16, chunk_size
  T = 3 * C
  rng = np.random.default_rng(int(decay * 100) + C)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  q, u, z = normal(B, T, H, K), normal(B, T, H, K) / np.sqrt(K), normal(B, T, H, V)
  e = u * jnp.asarray(rng.uniform(size=(B, T, H, 1)), jnp.float32)
  g = jnp.asarray(-decay * rng.uniform(0.5, 1.5, size=(B, T, H)), jnp.float32)
  h0, d_final, d_o = normal(B, H, K, V), normal(B, H, K, V), normal(B, T, H, V)
  documents = None
  if packed:  # starts inside the first and third chunks
    starts = jnp.zeros((B, T), bool).at[:, [5, 2 * C + 3]].set(True)
    documents = chunk_documents(starts, C)
  kw = dict(chunk_size=C, interpret=True)

  def backward(G):
    chunks = intra_chunk(q, (u, z, e), G, scale=K**-0.5, save_inverse=True, documents=documents, **kw)
    _, _, states, r = state_pass(chunks, h0, save_states=True, **kw)
    d_r, d_h0, d_states = state_pass_bwd(chunks, d_o, d_final, **kw)
    grads = intra_chunk_bwd(q, u, e, z, G, r, chunks.A, states, d_states, d_o, d_r, scale=K**-0.5,
                            documents=documents, **kw)
    return dict(zip(("d_r", "d_h0", "d_states", "dq", "du", "de", "dz", "dg"), (d_r, d_h0, d_states, *grads)))

  per_head = backward(chunk_cumsum(g, C, True))
  channels = backward(chunk_cumsum(jnp.broadcast_to(g[..., None], q.shape), C, True))
  assert per_head["dg"].shape == (B, T, H)
  channels["dg"] = jnp.sum(channels["dg"], axis=-1)
  for name, want in channels.items():
    got, want = np.asarray(per_head[name], np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), name
    assert relative_error(got, want) <= 1e-5, name


@pytest.mark.parametrize("decay", ["channel", "head"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_chunk_states_are_stored_in_the_io_operand_dtype_and_read_as_fp32(dtype, decay):
  """The state passes store every chunk's state and its gradient in bf16 under bf16 io (fp32 under fp32), and
  intra_chunk_bwd given them in bf16 returns exactly what it returns given the same values in fp32, since its dots
  round them to bf16 operands anyway (interpret mode; that its elementwise reader is fp32 is the next test's)."""
  B, H, K, V, C = 1, 2, 32, 16, 16
  T = 3 * C
  rng = np.random.default_rng(49)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)
  q, u, z = normal(B, T, H, K), normal(B, T, H, K) / np.sqrt(K), normal(B, T, H, V)
  e = (u * jnp.asarray(rng.uniform(size=(B, T, H, 1)), dtype)).astype(dtype)
  g = jnp.asarray(-0.05 * rng.uniform(0.5, 1.5, size=(B, T, H) + ((K,) if decay == "channel" else ())), jnp.float32)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  h0, d_final, d_o = f32(normal(B, H, K, V)), f32(normal(B, H, K, V)), normal(B, T, H, V)
  kw = dict(chunk_size=C, interpret=True)
  G = chunk_cumsum(g, C, True)
  chunks = intra_chunk(q, (u, z, e), G, scale=K**-0.5, save_inverse=True, **kw)
  _, _, states, r = state_pass(chunks, h0, save_states=True, **kw)
  d_r, _, d_states = state_pass_bwd(chunks, d_o, d_final, **kw)
  want = jnp.bfloat16 if dtype == jnp.bfloat16 else jnp.float32
  assert (states.dtype, d_states.dtype) == (want, want)
  backward = lambda s, ds: intra_chunk_bwd(q, u, e, z, G, r, chunks.A, s, ds, d_o, d_r, scale=K**-0.5, **kw)
  stored, widened = backward(states, d_states), backward(f32(states), f32(d_states))
  for name, a, b in zip(("dq", "du", "de", "dz", "dg"), stored, widened):
    a, b = np.asarray(f32(a)), np.asarray(f32(b))
    assert np.all(np.isfinite(a)) and np.any(a != 0), name
    np.testing.assert_array_equal(a, b, err_msg=name)


# What a backward kernel may do with a bf16 value: load and store it, transpose it, take it as a dot operand, convert it
# and carry it through control flow; anything else (a product, a sum) would be bf16 arithmetic.
BF16_USES = {"get", "swap", "transpose", "dot_general", "convert_element_type", "scan", "while", "cond", "jit",
             "pallas_call"}


@pytest.mark.parametrize("decay", ["channel", "head"])
def test_backward_kernels_do_no_arithmetic_in_bf16(decay):
  """Under bf16 io the chunk states and their gradients come in bf16, and intra_chunk_bwd (with pair_bwd) only loads
  them, transposes them and hands them to dots: d exp(G_C) = sum S dS is an fp32 product and sum. Interpret mode
  cannot show a bf16 product here (XLA drops the f32 -> bf16 -> f32 round trip on the CPU), so its program is read."""
  B, T, H, K, V, C = 1, 64, 2, 32, 16, 32
  N = T // C
  spec = lambda *shape, d=jnp.bfloat16: jax.ShapeDtypeStruct(shape, d)
  f32 = jnp.float32
  key, value = spec(B, T, H, K), spec(B, T, H, V)
  decays = spec(B, T, H, *((K,) if decay == "channel" else ()), d=f32)
  states = spec(B, H, N, K, V, d=saved_state_dtype(jnp.bfloat16))
  args = (key, key, key, value, decays, spec(B, T, H, V, d=f32), spec(B, T, H, C, d=f32), states, states, value,
          spec(B, T, H, V, d=f32))
  jaxpr = jax.make_jaxpr(lambda *a: intra_chunk_bwd(*a, scale=0.1, chunk_size=C, interpret=True))(*args)
  uses = {eqn.primitive.name for eqn in equations(jaxpr)
          if any(getattr(getattr(v, "aval", None), "dtype", None) == jnp.bfloat16 for v in eqn.invars)}
  assert "dot_general" in uses and uses <= BF16_USES, sorted(uses - BF16_USES)


H200 = 232_448  # bytes of shared memory per program (compute capability 9.0)


@pytest.mark.parametrize("chunk_size,dtype,block_v,want", [
    (32, jnp.bfloat16, 32, 3), (64, jnp.bfloat16, 32, 3), (64, jnp.bfloat16, 16, 3),  # ran on the H200 at 3 stages
    # asked 282,624 bytes at 2 stages / 286,720 at 3 there: compile failures
    (128, jnp.bfloat16, 32, 1), (64, jnp.float32, 16, 1),
])
def test_state_stages_fit_the_shared_memory_measured_on_the_h200(chunk_size, dtype, block_v, want):
  shape = Shape(B=4, H=16, K=128, V=128, dtype=jnp.dtype(dtype).name, chunk_size=chunk_size)
  rule = lambda **kw: StatePassSettings.defaults(shape, block_v=block_v, shared_memory=H200, **kw)
  assert rule().num_stages == want
  assert rule(num_stages=2).num_stages == 2  # asked for: kept
