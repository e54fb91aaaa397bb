"""chunk_size=None, every dense op's default: the chunk size is the rule of the impl that runs (DESIGN.md section 2),
so it follows the impl and, through impl="auto", the device; an explicit chunk_size wins; the default changes no
program. The device check is `validation.on_gpu` (jax.default_backend), monkeypatched here; the spies record what
reaches the implementations and run nothing."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from sdm_jax import ops
from sdm_jax.ops import delta_rule, sparse_delta
from sdm_jax.ops.pallas import PallasOpSettings
from sdm_jax.ops.validation import check_chunk_size
from sdm_jax.testing.inputs import make_inputs, seed_of
from sdm_jax.testing.runs import call, value_dim

B, H, K, V = 1, 2, 16, 16


def _inputs(mixer, T):
  return make_inputs(mixer, B, T, H, K, value_dim(mixer, K, V), 0.1, "random", seed_of("chunk size", mixer, T))


@pytest.fixture
def ran(monkeypatch):
  """{impl: [chunk sizes the impl was called with]}: delta_rule's "pallas" and "chunk" entry points replaced by
  recorders that return zeros."""
  calls = {"pallas": [], "chunk": []}

  def pallas(form, q, k, v, gates, g, scale, state, chunk_size, *rest):
    calls["pallas"].append(chunk_size)
    return jnp.zeros(q.shape[:3] + v.shape[-1:], v.dtype), state

  def chunk(q, u, e, z, g, scale, state, chunk_size, starts=None):
    calls["chunk"].append(chunk_size)
    return jnp.zeros(q.shape[:3] + z.shape[-1:], z.dtype), state

  monkeypatch.setattr(delta_rule, "delta_rule_pallas", pallas)
  monkeypatch.setattr(delta_rule, "delta_rule_chunk", chunk)
  return calls


def _on(monkeypatch, backend):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)


RULE = [  # backend, impl, T, the impl that runs, its chunk size
    ("cpu", "auto", 200, "chunk", 64),
    ("cpu", "chunk", 200, "chunk", 64),
    ("cpu", "chunk", 20, "chunk", 32),  # clamped to T's padded length
    ("cpu", "pallas", 200, "pallas", 32),
    ("cpu", "pallas", 20, "pallas", 32),  # the kernels' sizes are not clamped
    ("gpu", "auto", 200, "pallas", 32),
    ("gpu", "chunk", 200, "chunk", 64),
    ("gpu", "pallas", 200, "pallas", 32),
]


@pytest.mark.parametrize("mixer", ["gdn", "kda"])
@pytest.mark.parametrize("backend, impl, T, runs, chunk_size", RULE)
def test_the_default_is_the_rule_of_the_impl_that_runs(monkeypatch, ran, mixer, backend, impl, T, runs, chunk_size):
  _on(monkeypatch, backend)
  call(mixer, _inputs(mixer, T), impl=impl)
  assert ran == {"pallas": [], "chunk": [], runs: [chunk_size]}


@pytest.mark.parametrize("backend, impl, T, runs, chunk_size", RULE)
def test_the_rule_holds_for_the_formed_inputs_too(monkeypatch, ran, backend, impl, T, runs, chunk_size):
  _on(monkeypatch, backend)
  q, u, e = (jnp.ones((B, T, H, K)) for _ in range(3))
  ops.generalized_delta_rule(q, u, e, jnp.ones((B, T, H, V)), -jnp.ones((B, T, H)), impl=impl)
  assert ran == {"pallas": [], "chunk": [], runs: [chunk_size]}


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("impl, chunk_size, runs", [("pallas", 16, "pallas"), ("pallas", 64, "pallas"),
                                                    ("chunk", 16, "chunk"), ("chunk", 128, "chunk"),
                                                    ("auto", 16, None)])
def test_an_explicit_chunk_size_wins(monkeypatch, ran, backend, impl, chunk_size, runs):
  _on(monkeypatch, backend)
  call("kda", _inputs("kda", 200), impl=impl, chunk_size=chunk_size)
  runs = runs or ("pallas" if backend == "gpu" else "chunk")
  assert ran == {"pallas": [], "chunk": [], runs: [chunk_size]}


def test_the_rules_are_the_measured_ones():
  """impl="pallas": chunk 32 (sdm_jax/ops/pallas.py cites the H200 records); impl="chunk": 64 clamped to T."""
  assert PallasOpSettings.defaults() == PallasOpSettings(chunk_size=32)
  assert [delta_rule.chunk_size_of("pallas", None, T) for T in (1, 200, 32768)] == [32] * 3
  assert [delta_rule.chunk_size_of("chunk", None, T) for T in (1, 17, 33, 200)] == [16, 32, 64, 64]
  assert delta_rule.chunk_size_of("pallas", 64, 200) == 64 and delta_rule.chunk_size_of("chunk", 16, 200) == 16


@pytest.mark.parametrize("impl, chunk_size", [("pallas", 32), ("chunk", 64)])
def test_the_default_changes_no_program(impl, chunk_size):
  """The op with chunk_size=None traces to the very program of the rule's explicit size (pallas in interpret mode)."""
  inputs = _inputs("gdn2", 70)
  jaxpr = lambda **options: str(jax.make_jaxpr(lambda x: call("gdn2", x, impl=impl, **options))(inputs))
  assert jaxpr() == jaxpr(chunk_size=chunk_size)
  assert jaxpr() != jaxpr(chunk_size=16)  # the comparison sees the chunk size


def test_none_is_no_chunk_size_for_the_sdm_op():
  for implementation in sparse_delta.IMPLEMENTATIONS.values():  # each config checks the op's chunk_size
    with pytest.raises(ValueError, match=r"\bchunk_size\b"):
      dataclasses.replace(implementation.config, chunk_size=None)
  check_chunk_size(None, rule=True)  # the dense ops' rule takes None
