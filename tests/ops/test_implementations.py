"""The dense rule's implementation registry (`delta_rule.IMPLEMENTATIONS`): it is the list of names `impl` accepts,
impl="auto" runs its first implementation supported on the backend, and a throwaway implementation registered first
is what "auto" then runs while every name keeps running its own."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdm_jax import ops
from sdm_jax.ops import delta_rule
from sdm_jax.ops.delta_rule import IMPLEMENTATIONS, XlaImplementation, delta_rule_scan
from sdm_jax.ops.implementations import pick
from sdm_jax.testing.errors import FP32_TOL, assert_close
from sdm_jax.testing.inputs import make_inputs, seed_of
from sdm_jax.testing.runs import call, value_dim

B, T, H, K, V = 1, 20, 2, 16, 16


@dataclasses.dataclass(frozen=True)
class Recorded(XlaImplementation):
  """A throwaway implementation: the scan, counting its runs in `runs`, supported on every backend."""
  name: str = "recorded"
  runs: list = dataclasses.field(default_factory=list, compare=False, hash=False)

  def supported(self, backend):
    return True

  def run(self, q, u, e, z, g, scale, state, chunk_size, starts):
    self.runs.append(chunk_size)
    return delta_rule_scan(q, u, e, z, g, scale, state, starts)


@pytest.fixture
def recorded(monkeypatch):
  """Recorded() registered first in a copy of the registry, for one test."""
  implementation = Recorded()
  monkeypatch.setattr(delta_rule, "IMPLEMENTATIONS", {implementation.name: implementation, **IMPLEMENTATIONS})
  return implementation


def _inputs(mixer):
  return make_inputs(mixer, B, T, H, K, value_dim(mixer, K, V), 0.1, "random",
                     seed_of("implementations", mixer), normalize_k=True)


def _formed():
  rng = np.random.default_rng(seed_of("implementations", "formed"))
  q, u, e = (jnp.asarray(rng.normal(size=(B, T, H, K)) * 0.25, jnp.float32) for _ in range(3))
  z = jnp.asarray(rng.normal(size=(B, T, H, V)), jnp.float32)
  return q, u, e, z, -jnp.asarray(rng.uniform(0.05, 0.15, size=(B, T, H)), jnp.float32)


def _on(monkeypatch, backend):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)


def test_the_registry_is_in_autos_order_and_holds_the_config_impls():
  assert list(IMPLEMENTATIONS) == ["pallas", "chunk", "scan"]
  for name, implementation in IMPLEMENTATIONS.items():
    assert implementation.name == name
    assert dataclasses.is_dataclass(implementation.config) and implementation.config.__dataclass_params__.frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
      implementation.config.chunk_size = 1


@pytest.mark.parametrize("backend, runs", [("cpu", "chunk"), ("gpu", "pallas"), ("tpu", "chunk")])
def test_auto_is_the_first_supported(monkeypatch, backend, runs):
  _on(monkeypatch, backend)
  assert pick("auto", IMPLEMENTATIONS).name == runs
  assert [pick(name, IMPLEMENTATIONS).name for name in IMPLEMENTATIONS] == list(IMPLEMENTATIONS)
  assert not IMPLEMENTATIONS["scan"].supported(backend)  # the ground truth runs only when named


def test_auto_runs_a_throwaway_implementation_registered_first(recorded):
  inputs = _inputs("kda")
  o, state = call("kda", inputs, impl="auto", output_final_state=True)
  assert recorded.runs == [IMPLEMENTATIONS["chunk"].chunk_size(None, T)]  # its config's rule: 64 clamped to 32
  expected = call("kda", inputs, impl="scan", output_final_state=True)
  assert len(recorded.runs) == 1  # a name other than its own does not run it
  np.testing.assert_array_equal(o, expected[0])
  np.testing.assert_array_equal(state, expected[1])
  o, _ = ops.generalized_delta_rule(*_formed())  # the formed entry point picks from the same registry
  assert len(recorded.runs) == 2
  np.testing.assert_array_equal(o, ops.generalized_delta_rule(*_formed(), impl="scan")[0])


@pytest.mark.parametrize("impl", ["chunk", "pallas", "recorded"])
def test_every_name_runs_its_own_implementation(recorded, impl):
  o, _ = call("gdn2", _inputs("gdn2"), impl=impl)
  reference, _ = call("gdn2", _inputs("gdn2"), impl="scan")
  assert len(recorded.runs) == (impl == "recorded")
  if impl == "recorded":  # the scan itself
    np.testing.assert_array_equal(o, reference)
  else:
    assert_close({"o": o}, {"o": reference}, FP32_TOL[impl][0], impl)


def test_impl_accepts_the_registry_and_an_unknown_name_lists_it(recorded, monkeypatch):
  with pytest.raises(ValueError, match=r"impl: expected one of \('auto', 'recorded', 'pallas', 'chunk', 'scan'\), "
                                       r"got 'triton'"):
    call("gdn", _inputs("gdn"), impl="triton")
  with pytest.raises(ValueError, match=r"impl: expected one of \('auto', 'recorded', 'pallas', 'chunk', 'scan'\)"):
    ops.generalized_delta_rule(*_formed(), impl="triton")
  monkeypatch.setattr(delta_rule, "IMPLEMENTATIONS", IMPLEMENTATIONS)  # unregistered: the name is refused again
  with pytest.raises(ValueError, match=r"impl: expected one of \('auto', 'pallas', 'chunk', 'scan'\), got 'recorded'"):
    call("gdn", _inputs("gdn"), impl="recorded")


def test_auto_with_none_supported_says_so(monkeypatch):
  monkeypatch.setattr(delta_rule, "IMPLEMENTATIONS", {"scan": IMPLEMENTATIONS["scan"]})
  with pytest.raises(ValueError, match=r"impl: 'auto' found none of \('scan',\) supported on backend"):
    call("gdn", _inputs("gdn"))
