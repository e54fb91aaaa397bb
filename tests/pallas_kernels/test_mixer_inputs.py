"""Forming a mixer's inputs for impl="pallas": the fused mixer_inputs launch against the XLA reference, and the
forward kernels forming u, e, z themselves (`Form`) against the same kernels on mixer_inputs' output, for every
mixer's build, in interpret mode; 'cuda' lowering checks for an abstract NVIDIA H200. (The gradients through
the forming are checked in tests/ops, through impl="pallas".)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.delta_rule_fwd import chunk_cumsum, intra_chunk
from pallas_kernels.mixer_inputs import FORMED, form, mixer_inputs
from sdm_jax.ops.inputs import reference_inputs
from sdm_jax.ops import MIXERS
from sdm_jax.ops.registry import gate_shapes

from sdm_jax.testing.lowering import TRITON_CALL, lower_for_h200


def _kinds(mixer):
  return ("key", "value") + tuple(kind for _, kind in MIXERS[mixer].gates)


def _form(mixer, build, l2norm):
  return form(build, _kinds(mixer), l2norm)


def _build(mixer, B, T, H, K, V, dtype, seed=0):
  """(build, q, k, v, gates without g): the mixer's own build, from the registry."""
  r = np.random.default_rng(seed)
  shape = gate_shapes(B, T, H, K, V)
  x = lambda *s: jnp.asarray(r.normal(size=s), dtype)
  gates = [jnp.asarray(r.uniform(size=shape[kind]), dtype) for _, kind in MIXERS[mixer].gates]
  gates[0] = gates[0].at[..., :3].set(0.0)  # closed gates: sqrt's derivative is taken as 0 there
  return MIXERS[mixer].build, x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), gates


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_matches_reference(mixer, dtype):
  B, T, H, K, V = 2, 40, 3, 32, 32  # T not a whole number of the kernel's row blocks
  build, q, k, v, gates = _build(mixer, B, T, H, K, V, dtype)
  for l2 in (True, False):
    ours = mixer_inputs(build, l2, dtype, q, k, v, *gates, interpret=True)
    ref = reference_inputs(build, l2, dtype, q, k, v, *gates)
    for a, b in zip(ours, ref):
      assert a.dtype == b.dtype == dtype and a.shape == b.shape
      a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
      if dtype == jnp.float32:
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
      else:  # the same fp32 values up to op order, rounded to bf16: at most one bf16 step apart, and rarely
        np.testing.assert_allclose(a, b, rtol=2.0**-7, atol=1e-6)
        assert np.mean(a != b) < 0.01


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_kernels_form_what_mixer_inputs_writes(mixer):
  """intra_chunk forming u, e, z (and the l2norm) from q, k, v and the gates gives what it gives on the q, u, e, z
  that mixer_inputs writes, fp32."""
  B, T, H, K, V, C = 1, 64, 2, 32, 32, 32
  build, q, k, v, gates = _build(mixer, B, T, H, K, V, jnp.float32)
  G = chunk_cumsum(-jnp.asarray(np.random.default_rng(1).uniform(0, 1, (B, T, H, K)), jnp.float32), C, True)
  kw = dict(scale=K**-0.5, chunk_size=C, save_inverse=True, interpret=True)
  ours = intra_chunk(q, (k, v, *gates), G, form=_form(mixer, build, True), **kw)
  q_, u, e, z = mixer_inputs(build, True, jnp.float32, q, k, v, *gates, interpret=True)
  ref = intra_chunk(q_, (u, z, e), G, form=FORMED, **kw)
  for name in ours._fields:
    np.testing.assert_allclose(np.asarray(getattr(ours, name)), np.asarray(getattr(ref, name)), rtol=1e-5, atol=1e-6,
                               err_msg=name)


def test_form_finds_what_each_output_reads_and_rejects_crossing_sides():
  def build(k, v, b, w):
    return k, b * k, w * v
  assert form(build, ("key", "value", "key", "value"), True).needs == ({0}, {0, 2}, {1, 3})
  shared = form(lambda k, v, beta: (beta * k, beta * k, beta * v), ("key", "value", "key"), False)
  shared.check(32, 32)  # FG2-GDN's one gate scales k and v: fine when K == V
  with pytest.raises(ValueError, match="z may read only value"):
    shared.check(32, 64)
  with pytest.raises(ValueError, match="kinds"):
    form(build, ("value", "key", "key", "value"), False)


def test_head_dims_it_does_not_take_are_refused():
  """The op forms such inputs by the reference instead (tests/ops/test_chunk_vs_scan.py holds it to the chunk impl)."""
  build, q, k, v, gates = _build("gdn2", 1, 8, 2, 24, 32, jnp.float32)  # K = 24: not a power of two
  with pytest.raises(ValueError, match="K = 24, V = 32"):
    mixer_inputs(build, True, jnp.float32, q, k, v, *gates, interpret=True)


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_lowers_for_cuda(mixer):
  build, *_ = _build(mixer, 1, 64, 2, 128, 128, jnp.float32)
  shape = gate_shapes(1, 64, 2, 128, 128)
  spec = lambda s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
  args = [spec(shape[kind]) for kind in ("key", *_kinds(mixer))]  # q, k, v, the gates
  text = lower_for_h200(lambda *a: mixer_inputs(build, True, jnp.bfloat16, *a), *args)
  assert text.count(TRITON_CALL) == 1 and "mixer_inputs" in text
  f = _form(mixer, build, True)
  G = jax.ShapeDtypeStruct(shape["key"], jnp.float32)
  text = lower_for_h200(lambda q, k, v, G, *gates: intra_chunk(q, (k, v, *gates), G, form=f, scale=0.1,
                                                               chunk_size=32), *args[:3], G, *args[3:])
  assert text.count(TRITON_CALL) == 2  # gram_solve and solved, forming u, e, z from k, v and the gates


def test_eager_calls_reuse_the_forming_kernels_compilation():
  """A mixer's build is the same function on every call, so the jitted intra_chunk (which takes the Form as a
  static argument) compiles once for repeated eager calls of the op."""
  B, T, H, K, V = 1, 32, 2, 16, 16
  _, q, k, v, (b, w) = _build("gdn2", B, T, H, K, V, jnp.float32)
  g = -jnp.ones((B, T, H, K), jnp.float32)
  run = lambda: MIXERS["gdn2"].op(q, k, v, g, b, w, impl="pallas", chunk_size=16, use_qk_l2norm=True)
  first = run()[0]
  compiled = intra_chunk._cache_size()
  np.testing.assert_array_equal(np.asarray(run()[0]), np.asarray(first))
  assert intra_chunk._cache_size() == compiled
