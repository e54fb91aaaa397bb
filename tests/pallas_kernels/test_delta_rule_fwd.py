"""The Pallas forward kernels: interpret-mode numerics against the float64 scan, and a 'cuda' lowering
check for an abstract NVIDIA H200 (catches primitives that interpret mode accepts but Triton does not)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.chunk_math import lowest_bound
from pallas_kernels.delta_rule_fwd import ChunkTensors, chunk_cumsum, delta_rule_fwd, intra_chunk, state_pass
from sdm_jax.ops import l2norm
from sdm_jax.ops.scan import delta_rule_scan

from sdm_jax.testing.errors import relative_error
from sdm_jax.testing.lowering import TRITON_CALL, lower_for_h200


def _inputs(seed, B, T, H, K, V, decay, gate):
  r = np.random.default_rng(seed)
  q = np.asarray(l2norm(r.normal(size=(B, T, H, K))))
  k = np.asarray(l2norm(r.normal(size=(B, T, H, K))))
  b = {"zero": np.zeros((B, T, H, K)), "one": np.ones((B, T, H, K)), "rand": r.uniform(size=(B, T, H, K))}[gate]
  w = r.uniform(size=(B, T, H, V))
  u, e, z = k, b * k, w * r.normal(size=(B, T, H, V))
  g = -decay * r.uniform(0.5, 1.0, size=(B, T, H, K))
  h0 = r.normal(size=(B, H, K, V))
  return q, u, e, z, g, h0


@pytest.mark.parametrize("decay,gate,chunk_size,seed", [
    (0.01, "rand", 64, 0), (1.0, "rand", 32, 1), (30.0, "rand", 64, 2), (1.0, "zero", 16, 3), (0.1, "one", 64, 4),
    # With lower_bound, the lowest the chunk size takes, gram_solve forms each gram in two dots: g at the bound
    # everywhere, or mixed between it and 0.
    ("at bound", "rand", 16, 5), ("above bound", "rand", 32, 6), ("at bound", "rand", 32, 7),
])
def test_forward_matches_scan(decay, gate, chunk_size, seed):
  B, H, K, V = 1, 2, 32, 16
  T = 2 * chunk_size
  bounded = isinstance(decay, str)
  q, u, e, z, g, h0 = _inputs(seed, B, T, H, K, V, 1.0 if bounded else decay, gate)
  lower_bound = lowest_bound(chunk_size) if bounded else None
  if bounded:
    g = lower_bound * (np.ones_like(g) if decay == "at bound" else np.random.default_rng(seed).uniform(size=g.shape))
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  o, final_state = delta_rule_fwd(*map(f32, (q, u, e, z, g, h0)), scale=K**-0.5, chunk_size=chunk_size,
                                  lower_bound=lower_bound, interpret=True)
  with jax.enable_x64(True):
    o_ref, s_ref = delta_rule_scan(*map(lambda x: jnp.asarray(x, jnp.float64), (q, u, e, z, g)),
                                   K**-0.5, jnp.asarray(h0, jnp.float64))
    o_ref, s_ref = np.asarray(o_ref), np.asarray(s_ref)
  assert relative_error(o, o_ref) < 1e-4
  # Elementwise too, so a single unwritten row or tile cannot hide inside the norm.
  assert np.max(np.abs(np.asarray(o) - o_ref)) < 1e-4 * np.max(np.abs(o_ref))
  assert relative_error(final_state, s_ref) < 1e-4


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_lowers_for_cuda(dtype, chunk_size):
  """Also with lower_bound, whose gram_solve forms each gram in two dots (the lowest bound) or one (half of it)."""
  B, T, H, K, V = 1, 2 * chunk_size, 2, 128, 64
  spec = lambda *shape, d=dtype: jax.ShapeDtypeStruct(shape, d)
  args = (spec(B, T, H, K), spec(B, T, H, K), spec(B, T, H, K), spec(B, T, H, V), spec(B, T, H, K, d=jnp.float32),
          spec(B, H, K, V, d=jnp.float32))
  for lower_bound in (None, lowest_bound(chunk_size), lowest_bound(chunk_size) / 2):
    text = lower_for_h200(lambda *a: delta_rule_fwd(*a, scale=0.1, chunk_size=chunk_size, lower_bound=lower_bound),
                          *args)
    assert text.count(TRITON_CALL) == 4  # chunk_cumsum, gram_solve, solved, state_pass


def test_lower_bound_is_refused_with_one_decay_per_head_and_beyond_the_chunks_limit():
  q = jnp.zeros((1, 32, 1, 16), jnp.float32)
  for G, bound, why in ((jnp.zeros((1, 32, 1), jnp.float32), -1.0, "one decay per head"),
                        (jnp.zeros((1, 32, 1, 16), jnp.float32), -5.5, r"\[-5, 0\) at chunk size 32")):
    with pytest.raises(ValueError, match=f"^lower_bound: expected None.*{why}"):
      intra_chunk(q, (q, q, q), G, scale=1.0, chunk_size=32, lower_bound=bound, interpret=True)


def test_chunk_cumsum_restarts_every_chunk():
  g = np.random.default_rng(0).uniform(-3.0, 0.0, size=(2, 48, 3, 16)).astype(np.float32)
  G = np.asarray(chunk_cumsum(jnp.asarray(g), 16, interpret=True))
  ref = np.cumsum(g.reshape(2, 3, 16, 3, 16).astype(np.float64), axis=2).reshape(g.shape)
  np.testing.assert_allclose(G, ref, rtol=1e-6, atol=1e-5)
  # Packed documents: g counts only where keep is nonzero (padding and document starts are taken as 0).
  keep = np.random.default_rng(1).integers(0, 2, size=(2, 48)).astype(np.int32)
  G = np.asarray(chunk_cumsum(jnp.asarray(g), 16, interpret=True, keep=jnp.asarray(keep)))
  kept = np.where(keep[:, :, None, None] != 0, g, 0.0)
  ref = np.cumsum(kept.reshape(2, 3, 16, 3, 16).astype(np.float64), axis=2).reshape(g.shape)
  np.testing.assert_allclose(G, ref, rtol=1e-6, atol=1e-5)
  # One decay per head: g [B, T, H] gives G [B, T, H], the per-channel G of any one channel.
  for keep_mask in (None, jnp.asarray(keep)):
    channels = np.asarray(chunk_cumsum(jnp.asarray(g), 16, interpret=True, keep=keep_mask))
    per_head = np.asarray(chunk_cumsum(jnp.asarray(g[..., 3]), 16, interpret=True, keep=keep_mask))
    assert per_head.shape == g.shape[:3]
    np.testing.assert_array_equal(per_head, channels[..., 3])


@pytest.mark.parametrize("decay,gate,chunk_size", [(0.05, "rand", 32), (30.0, "rand", 16), (1.0, "zero", 64)])
def test_scalar_decay_kernels_match_the_per_channel_ones(decay, gate, chunk_size):
  """The forward with one decay per head (GDN: g and G [B, T, H]) gives what the per-channel kernels give with
  that decay broadcast over K: every chunk tensor (exp(G_C) once per head), then o and the final state, also with
  g down to -30 per step."""
  B, H, K, V, C = 1, 2, 32, 16, chunk_size
  T = 2 * C
  q, u, e, z, g, h0 = _inputs(5, B, T, H, K, V, decay, gate)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  q, u, e, z, h0, g = f32(q), f32(u), f32(e), f32(z), f32(h0), f32(g[..., 0])
  G = chunk_cumsum(g, C, True)
  G_channels = chunk_cumsum(jnp.broadcast_to(g[..., None], q.shape), C, True)
  kw = dict(scale=K**-0.5, chunk_size=C, save_inverse=True, interpret=True)
  scalar, channels = intra_chunk(q, (u, z, e), G, **kw), intra_chunk(q, (u, z, e), G_channels, **kw)
  assert scalar.decay_last.shape == (B, T // C, H)
  scalar = scalar._replace(decay_last=jnp.broadcast_to(scalar.decay_last[..., None], channels.decay_last.shape))
  pass_kw = dict(chunk_size=C, save_states=True, interpret=True)
  names = ChunkTensors._fields + ("o", "final_state", "states", "R")
  for name, a, b in zip(names, (*scalar, *state_pass(scalar, h0, **pass_kw)),
                        (*channels, *state_pass(channels, h0, **pass_kw))):
    a, b = np.asarray(a), np.asarray(b)
    assert np.all(np.isfinite(a)), name
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-6 * max(np.max(np.abs(b)), 1e-30), err_msg=name)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_scalar_decay_lowers_for_cuda(dtype):
  """The cumsum, both per-chunk launches and the state pass with one decay per head (G [B, T, H], exp(G_C)
  [B, N, H])."""
  B, T, H, K, V, C = 1, 64, 2, 128, 64, 32
  spec = lambda *shape, d=dtype: jax.ShapeDtypeStruct(shape, d)
  f32 = jnp.float32
  key, value = spec(B, T, H, K), spec(B, T, H, V)
  assert lower_for_h200(lambda g: chunk_cumsum(g, C), spec(B, T, H, d=f32)).count(TRITON_CALL) == 1
  text = lower_for_h200(lambda q, u, e, z, G: intra_chunk(q, (u, z, e), G, scale=0.1, chunk_size=C), key, key, key,
                        value, spec(B, T, H, d=f32))
  assert text.count(TRITON_CALL) == 2
  chunks = ChunkTensors(Y=key, U=value, Aqk=spec(B, T, H, C), q_decayed=key, u_decayed=key,
                        decay_last=spec(B, T // C, H, d=f32))
  text = lower_for_h200(lambda *a: state_pass(*a, chunk_size=C, save_states=True), chunks, spec(B, H, K, V, d=f32))
  assert text.count(TRITON_CALL) == 1
