"""impl="chunk" and impl="pallas" (interpret mode on CPU) in fp32 against the float64 scan: outputs,
final state and every gradient (DESIGN.md section 6); for pallas also the forward without gradients, whose kernels
form u, e, z from the mixer's inputs themselves.

Each axis of DESIGN.md section 6's sweep (T, decay strength, gate extremes, initial state, chunk size, where the
keys are normalised) is covered by a few cases per mixer rather than by the full product.
"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from sdm_jax.testing.errors import FP32_TOL, assert_close, error_report, results
from sdm_jax.testing.inputs import cast, cotangents, make_inputs, seed_of
from sdm_jax.testing.runs import MIXERS, call, outputs_and_grads, value_dim


B, H, K, V = 2, 2, 16, 32


@dataclasses.dataclass(frozen=True)
class Config:
  """What changes the compiled program; `variants` (decay scale, gate mode) are only data."""
  T: int
  h0: bool  # pass an initial state
  chunk: int
  l2norm: bool  # use_qk_l2norm=True, else k is normalised by the test
  variants: tuple

  def __str__(self):
    return f"T{self.T}-{'h0' if self.h0 else 'noh0'}-C{self.chunk}-{'l2norm' if self.l2norm else 'unitk'}"


# Exact-zero gates only with an initial state: without one nothing is ever written and o == 0.
CONFIGS = [
    Config(T=1, h0=True, chunk=64, l2norm=True, variants=((0.1, "random"), (30.0, "zero"))),
    Config(T=63, h0=False, chunk=16, l2norm=True, variants=((0.01, "random"), (1.0, "binary"))),
    Config(T=64, h0=True, chunk=64, l2norm=False, variants=((1.0, "one"), (0.01, "random"))),
    Config(T=65, h0=True, chunk=32, l2norm=True,
           variants=((30.0, "random"), (0.3, "zero"), (30.0, "zero"), ("mixed", "binary"))),
    Config(T=200, h0=False, chunk=32, l2norm=False,
           variants=((0.01, "random"), ("mixed", "binary"), (0.01, "one"))),
]


def _inputs(mixer, T, decay, gates, h0, l2norm, seed):
  return make_inputs(mixer, B, T, H, K, value_dim(mixer, K, V), decay, gates, seed, jnp.float32,
                     initial_state=h0, normalize_k=not l2norm)


def _weights(mixer, T, seed, dtype=jnp.float32):
  Vm = value_dim(mixer, K, V)
  return cotangents((B, T, H, Vm), (B, H, K, Vm), seed, dtype)


# The full product of DESIGN.md section 6's sweep, behind the `slow` marker (about 2 hours on 2 cores).
FULL_SWEEP = [
    Config(T=T, h0=h0, chunk=chunk, l2norm=True,
           variants=tuple((decay, gates) for decay in (0.01, 1.0, 30.0, "mixed")
                          for gates in ("random", "one", "binary") + (("zero",) if h0 else ())))
    for T in (1, 63, 64, 65, 200) for h0 in (True, False) for chunk in (16, 32, 64)
]


def _rotated(mixer, config, impl):
  """CI runs three consecutive CONFIGS per mixer and impl, pallas's shifted by two from chunk's, so every mixer
  meets all five configs and every impl meets each config with three mixers; the other pairs run with -m slow."""
  first = MIXERS.index(mixer) + (2 if impl == "pallas" else 0)
  return (CONFIGS.index(config) - first) % len(CONFIGS) < 3


CASES = [pytest.param(mixer, config, impl, id=f"{mixer}-{config}-{impl}",
                      marks=() if _rotated(mixer, config, impl) else pytest.mark.slow)
         for mixer in MIXERS for config in CONFIGS for impl in ("chunk", "pallas")]


@pytest.mark.parametrize("mixer, config, impl", CASES)
def test_matches_float64_scan(x64, mixer, config, impl):
  _check_config(mixer, config, impl)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["chunk", "pallas"])
@pytest.mark.parametrize("config", FULL_SWEEP, ids=str)
@pytest.mark.parametrize("mixer", MIXERS)
def test_full_sweep_matches_float64_scan(x64, mixer, config, impl):
  _check_config(mixer, config, impl)


def _check_config(mixer, config, impl):
  """Every variant of a config runs on one compilation; all failing variants are reported together."""
  tol_out, tol_grad = FP32_TOL[impl]
  failures = []
  forward = _forward(mixer, impl=impl, chunk_size=config.chunk, use_qk_l2norm=config.l2norm)  # one compile
  for decay, gates in config.variants:
    seed = seed_of(mixer, str(config), decay, gates)
    inputs = _inputs(mixer, config.T, decay, gates, config.h0, config.l2norm, seed)
    r_o, r_s = _weights(mixer, config.T, seed + 1)
    actual = results(*outputs_and_grads(mixer, inputs, r_o, r_s, impl=impl, chunk_size=config.chunk,
                                        use_qk_l2norm=config.l2norm))
    assert {name: x.dtype for name, x in actual.items()} == {name: jnp.float32 for name in actual}
    reference = results(*outputs_and_grads(mixer, cast(inputs, jnp.float64), r_o.astype(jnp.float64),
                                           r_s.astype(jnp.float64), impl="scan", use_qk_l2norm=config.l2norm))
    outputs = ("o", "final_state")
    if impl == "pallas":  # without gradients the kernels form u, e, z themselves: a path of its own
      o, final_state = forward(inputs)
      actual.update({"o (no grad)": o, "final_state (no grad)": final_state})
      outputs += ("o (no grad)", "final_state (no grad)")
      reference.update({"o (no grad)": reference["o"], "final_state (no grad)": reference["final_state"]})
    for names, tol in ((outputs, tol_out), ([n for n in reference if n not in outputs], tol_grad)):
      failed, report = error_report({n: actual[n] for n in names}, {n: reference[n] for n in names}, tol)
      if failed:
        failures.append(f"decay {decay}, gates {gates} (tolerance {tol:.0e}):\n{report}")
  assert not failures, (f"{impl} fp32 vs scan float64, {mixer} {config} (||x - ref|| / ||ref||):\n"
                        + "\n".join(failures))


def _forward(mixer, **options):
  return jax.jit(lambda inputs: call(mixer, inputs, output_final_state=True, **options))


@pytest.mark.parametrize("impl", ["chunk", "pallas"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_chunk_size_does_not_change_result(mixer, impl):
  inputs = _inputs(mixer, 100, "mixed", "random", True, True, seed_of("chunk_size", mixer))
  small, large = (_forward(mixer, impl=impl, chunk_size=chunk, use_qk_l2norm=True)(inputs) for chunk in (16, 64))
  assert_close(results(*small), results(*large), FP32_TOL[impl][0], f"{impl}: chunk_size 16 vs 64, {mixer}")


def test_head_dims_the_kernels_pad():
  """K = V = 24 (not a power of two): the pallas op pads the kernels' widths and forms q, u, e, z for its backward
  by the reference, not the mixer_inputs launch; outputs and gradients as the chunk impl's."""
  inputs = make_inputs("kda", 1, 20, 1, 24, 24, 1.0, "random", seed_of("head dims 24"), initial_state=True)
  r_o, r_s = cotangents((1, 20, 1, 24), (1, 1, 24, 24), seed_of("head dims 24 weights"))
  got, want = (results(*outputs_and_grads("kda", inputs, r_o, r_s, impl=impl, chunk_size=16, use_qk_l2norm=True))
               for impl in ("pallas", "chunk"))
  assert_close(got, want, FP32_TOL["pallas"][1], "pallas vs chunk at K = V = 24, kda")


@pytest.mark.parametrize("mixer", MIXERS)
def test_padding_does_not_leak(mixer):
  """T=65 pads the last chunk; it must give the first 65 outputs of the unpadded T=128 run."""
  long = _inputs(mixer, 128, "mixed", "random", True, True, seed_of("padding", mixer))
  short = {name: x if name == "initial_state" else x[:, :65] for name, x in long.items()}
  run = _forward(mixer, impl="chunk", chunk_size=64, use_qk_l2norm=True)
  o_short, _ = run(short)
  o_long, _ = run(long)
  assert_close({"o": o_short}, {"o": o_long[:, :65]}, 1e-6, f"T=65 vs T=128[:65], {mixer}")
