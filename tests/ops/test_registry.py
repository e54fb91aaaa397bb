"""The mixer registry (sdm_jax/ops/registry.py): the "add a mixer" path of README "Contributing: adding a mixer",
walked with a throwaway mixer registered for one test, and every registered mixer present wherever mixers are
listed."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.configs import common, paper
from sdm_jax import ops
from sdm_jax.benchmarking import registry
from sdm_jax.layers import PRESETS, DeltaMixer
from sdm_jax.layers.delta import DEFAULT_PRESETS
from sdm_jax.ops import MIXERS, Mixer, register
from sdm_jax.ops.registry import gate_shapes
from sdm_jax.testing.errors import FP32_TOL, assert_close, results
from sdm_jax.testing.inputs import cast, cotangents, make_inputs, make_op_inputs, seed_of
from sdm_jax.testing.runs import call, outputs_and_grads


def _toy_build(k, v, beta):
  return k, beta * k, v


# GDN-2 with the write gate fixed open: u = k, e = beta * k, z = v, beta per key channel.
TOY = Mixer("toy", "toy_rule", _toy_build, decay="key", gates=(("beta", "key"),), doc="A throwaway mixer.")
B, T, H, K = 1, 33, 2, 16  # T = 33 with chunk_size 16: two full chunks and one token


@pytest.fixture
def toy():
  yield register(TOY)
  del MIXERS[TOY.name]


def test_registering_a_taken_name_raises(toy):
  with pytest.raises(ValueError, match="name"):
    register(dataclasses.replace(MIXERS["gdn2"], op_name="another_gdn2"))
  with pytest.raises(ValueError, match="op_name"):
    register(dataclasses.replace(TOY, name="toy2", op_name="kda"))
  with pytest.raises(ValueError, match="gates"):
    Mixer("bad", "bad", _toy_build, decay="key", gates=(("beta", "channel"),))


def test_the_public_ops_are_the_registry_entries():
  assert [MIXERS[name].op for name in ("gdn", "kda", "fg2_gdn", "fg2_gdn_plus", "gdn2")] == [
      ops.gated_delta_rule, ops.kda, ops.fg2_gdn, ops.fg2_gdn_plus, ops.gdn2]
  options = ("*, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm=False, impl='auto', "
             "chunk_size=None, segment_ids=None, lower_bound=None")
  assert str(inspect.signature(ops.gdn2)) == f"(q, k, v, g, b, w, {options})"  # DESIGN.md section 5
  assert ops.gdn2.__name__ == "gdn2" and ops.gdn2.__doc__.startswith("Gated DeltaNet-2: S_t =")


def test_a_registered_mixer_runs_through_every_impl(toy, x64):
  seed = seed_of("toy")
  inputs = make_inputs("toy", B, T, H, K, K, "mixed", "random", seed)
  r_o, r_s = cotangents((B, T, H, K), (B, H, K, K), seed + 1)
  reference = results(*outputs_and_grads("toy", cast(inputs, jnp.float64), r_o.astype(jnp.float64),
                                         r_s.astype(jnp.float64), impl="scan", use_qk_l2norm=True))
  # Its own reference: GDN-2 with the write gate w = 1.
  gdn2_inputs = cast({**inputs, "b": inputs["beta"], "w": jnp.ones((B, T, H, K))}, jnp.float64)
  o, final_state = call("gdn2", gdn2_inputs, impl="scan", use_qk_l2norm=True, output_final_state=True)
  assert_close({"o": o, "final_state": final_state},
               {name: reference[name] for name in ("o", "final_state")}, 1e-12, "toy vs GDN-2 with w = 1")
  for impl in ("chunk", "pallas"):
    actual = results(*outputs_and_grads("toy", inputs, r_o, r_s, impl=impl, chunk_size=16, use_qk_l2norm=True))
    out_tol, grad_tol = FP32_TOL[impl]
    for names, tol in ((("o", "final_state"), out_tol), (tuple(n for n in actual if n.startswith("d_")), grad_tol)):
      assert_close({n: actual[n] for n in names}, {n: reference[n] for n in names}, tol, f"toy {impl} vs scan")


@nnx.jit(static_argnames="prompt_len")
def _prefill_then_steps(layer, x, prompt_len):
  y, cache = layer.prefill(x[:, :prompt_len])

  def step(cache, x_t):
    y_t, cache = layer.step(x_t, cache)
    return cache, y_t

  _, ys = jax.lax.scan(step, cache, jnp.moveaxis(x[:, prompt_len:], 1, 0))
  return jnp.concatenate([y, jnp.moveaxis(ys, 0, 1)], axis=1)


def test_a_registered_mixer_runs_in_the_layer_and_decodes(toy):
  width = 32
  layer = DeltaMixer(width, mixer="toy", num_heads=H, head_dim=K, value_dim=8, impl="chunk", chunk_size=16,
                     rngs=nnx.Rngs(0))
  assert layer.layer == DEFAULT_PRESETS["fla"] and layer.beta_proj.out_features == H * K
  x = jax.random.normal(jax.random.key(0), (B, T, width), jnp.float32)
  full = nnx.jit(lambda layer, x: layer(x))(layer, x)
  assert full.shape == (B, T, width) and bool(jnp.all(jnp.isfinite(full)))
  decoded = _prefill_then_steps(layer, x, 20)  # the prompt ends inside the second chunk
  np.testing.assert_allclose(decoded, full, rtol=0, atol=1e-5 * float(jnp.abs(full).max()))


@pytest.mark.parametrize("name", list(MIXERS))
def test_every_mixer_is_wherever_mixers_are_listed(name):
  mixer = MIXERS[name]
  # The layer: takes it, with a projection per gate.
  layer = nnx.eval_shape(lambda: DeltaMixer(16, mixer=name, num_heads=2, head_dim=8, value_dim=mixer.value_dim(8, 4),
                                            rngs=nnx.Rngs(0)))
  assert all(hasattr(layer, f"{gate}_proj") for gate, _ in mixer.gates)
  # The input generator of the benchmarks and tools.
  fn, args = make_op_inputs(name, 1, 3, 2, 8, 8, "float32", 0)
  shapes = gate_shapes(1, 3, 2, 8, 8)
  assert list(args) == [*mixer.arguments, "initial_state"]
  assert [args[gate].shape for gate, _ in mixer.gates] == [shapes[kind] for _, kind in mixer.gates]
  # The experiment configs and the decode benchmark's default models.
  assert name in common.VARIANTS and f"{name}_340m" in paper.NAMES
  config = common.model_config(name, 32)
  assert (config.mixer, config.pattern) == (name, "D")
  assert name in registry.settings("decode").variants
  # The tests that hold each mixer to its paper check their own lists: tests/ops/test_reference.py (the NumPy loop),
  # tests/layers/test_delta_layers.py (the layer's gate widths); tests/inference/test_decode.py decodes every mixer.


def test_the_layer_presets_name_registered_mixers():
  assert set(PRESETS) <= set(MIXERS)
