"""The implementation registries of Sparse Delta Memory (`sparse_delta.IMPLEMENTATIONS`) and product-key addressing
(`product_key.IMPLEMENTATIONS`), as the dense rule's (test_implementations.py): each is the list of names `impl`
accepts, impl="auto" runs its first implementation supported on the backend, a throwaway implementation registered
first is what "auto" then runs while every name keeps running its own, and the op's options are the fields of the
implementations' configs (`implementations.configure`)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs.mqar import get_config
from sdm_jax.ops import delta_rule, product_key, product_key_address, sparse_delta, sparse_delta_rule
from sdm_jax.ops.implementations import configure, pick
from sdm_jax.ops.sparse_chunk import ChunkConfig
from sdm_jax.ops.sparse_pallas import DEFAULT_LAUNCHES, PallasConfig
from sdm_jax.training.config import ConfigError, check_config

SPARSE, ADDRESS = sparse_delta.IMPLEMENTATIONS, product_key.IMPLEMENTATIONS
B, T, H, N, V, W, R = 2, 21, 2, 16, 8, 3, 4


@dataclasses.dataclass(frozen=True)
class RecordedSparse:
  """A throwaway sparse implementation: the scan, recording the config of each run, supported on every backend."""
  name: str = "recorded"
  config: ChunkConfig = ChunkConfig()
  runs: list = dataclasses.field(default_factory=list, compare=False, hash=False)

  def supported(self, backend):
    return True

  def run(self, *args):
    self.runs.append(self.config)
    return SPARSE["scan"].run(*args)


@dataclasses.dataclass(frozen=True)
class RecordedAddress:
  """A throwaway addressing implementation: XLA's, counting its runs, supported on every backend."""
  name: str = "recorded"
  config: product_key.XlaConfig = product_key.XlaConfig()
  runs: list = dataclasses.field(default_factory=list, compare=False, hash=False)

  def supported(self, backend):
    return True

  def slots(self, *args):
    self.runs.append(args[-1])
    return ADDRESS["xla"].slots(*args)


@pytest.fixture
def recorded(monkeypatch):
  """RecordedSparse() registered first in a copy of the sparse registry, for one test."""
  implementation = RecordedSparse()
  monkeypatch.setattr(sparse_delta, "IMPLEMENTATIONS", {implementation.name: implementation, **SPARSE})
  return implementation


@pytest.fixture
def recorded_address(monkeypatch):
  implementation = RecordedAddress()
  monkeypatch.setattr(product_key, "IMPLEMENTATIONS", {implementation.name: implementation, **ADDRESS})
  return implementation


def _sparse_inputs(seed=0):
  rng = np.random.default_rng(seed)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  return dict(m0=f32(rng.normal(size=(H, N, V))), k_idx=jnp.asarray(rng.integers(0, N, (B, T, H, W))),
              k_w=f32(rng.dirichlet(np.ones(W), (B, T, H))), v=f32(rng.normal(size=(B, T, H, V))),
              g=f32(-rng.uniform(0.5, 1.5, (B, T, H))), beta=f32(rng.uniform(size=(B, T, H))),
              q_idx=jnp.asarray(rng.integers(0, N, (B, T, H, R))), q_w=f32(rng.dirichlet(np.ones(R), (B, T, H))))


def _address_inputs(seed=0, n=8, D=16):
  rng = np.random.default_rng(seed)
  shapes = {"x1": (B, T, H, D), "x2": (B, T, H, D), "c1": (H, n, D), "c2": (H, n, D)}
  return {name: jnp.asarray(rng.standard_normal(shape), jnp.float32) for name, shape in shapes.items()}


def _sparse(**options):
  return sparse_delta_rule(**_sparse_inputs(), output_final_state=True, **options)


def _on(monkeypatch, backend):
  monkeypatch.setattr(jax, "default_backend", lambda: backend)


def test_the_registries_are_in_autos_order_with_frozen_configs():
  assert list(SPARSE) == ["pallas", "chunk", "scan"]
  assert list(ADDRESS) == ["pallas", "xla"]
  for registry in (SPARSE, ADDRESS):
    for name, implementation in registry.items():
      assert implementation.name == name
      assert dataclasses.is_dataclass(implementation.config) and implementation.config.__dataclass_params__.frozen
  with pytest.raises(dataclasses.FrozenInstanceError):
    SPARSE["pallas"].config.table_dtype = "bfloat16"
  # The options' defaults are the exact fp32 recurrence and the kernels' measured launch.
  assert SPARSE["pallas"].config == PallasConfig(16, "float32", 1, "float32", "float32", DEFAULT_LAUNCHES)
  assert SPARSE["chunk"].config == SPARSE["scan"].config == ChunkConfig(16)


@pytest.mark.parametrize("backend, runs", [("cpu", ("chunk", "xla")), ("gpu", ("pallas", "pallas")),
                                           ("tpu", ("chunk", "xla"))])
def test_auto_is_the_first_supported(monkeypatch, backend, runs):
  _on(monkeypatch, backend)
  assert (pick("auto", SPARSE).name, pick("auto", ADDRESS).name) == runs
  for registry in (SPARSE, ADDRESS):
    assert [pick(name, registry).name for name in registry] == list(registry)
  assert not SPARSE["scan"].supported(backend)  # the reference runs only when named


def test_auto_runs_a_throwaway_implementation_registered_first(recorded):
  o, table = _sparse()
  assert recorded.runs == [ChunkConfig(16)]
  expected = _sparse(impl="scan")
  assert len(recorded.runs) == 1  # a name other than its own does not run it
  np.testing.assert_array_equal(o, expected[0])
  np.testing.assert_array_equal(table, expected[1])
  _sparse(chunk_size=32)  # the op's options set the fields of the config of the implementation that runs
  assert recorded.runs[-1] == ChunkConfig(32)


def test_auto_runs_the_implementation_it_picks_without_the_options_its_config_lacks(recorded):
  o, _ = _sparse(table_dtype="bfloat16", rows_segments=2, launch=((16, 4), (16, 4)))
  assert recorded.runs == [ChunkConfig(16)]
  np.testing.assert_array_equal(o, _sparse(impl="scan")[0])
  with pytest.raises(ValueError, match=r"^rows_dtype: expected one of \('float32', 'bfloat16'\), got 'float16'"):
    _sparse(rows_dtype="float16")  # checked by the config that has it, whatever impl runs
  assert len(recorded.runs) == 1


@pytest.mark.parametrize("impl", ["chunk", "pallas", "recorded"])
def test_every_sparse_name_runs_its_own_implementation(recorded, impl):
  o, table = _sparse(impl=impl)
  reference = _sparse(impl="scan")
  assert len(recorded.runs) == (impl == "recorded")
  for x, ref in zip((o, table), reference):
    np.testing.assert_allclose(x, ref, rtol=1e-5, atol=1e-5)


def test_auto_addressing_runs_a_throwaway_registered_first_and_names_their_own(recorded_address):
  x = _address_inputs()
  idx, weights = product_key_address(**x, k=4)
  assert recorded_address.runs == [4]
  for impl in ADDRESS:
    own_idx, own_weights = product_key_address(**x, k=4, impl=impl)
    np.testing.assert_array_equal(own_idx, idx)
    np.testing.assert_allclose(own_weights, weights, rtol=1e-6)
  assert len(recorded_address.runs) == 1


def test_impl_accepts_the_registry_and_an_unknown_name_lists_it(recorded, recorded_address):
  with pytest.raises(ValueError, match=r"^impl: expected one of \('auto', 'recorded', 'pallas', 'chunk', 'scan'\), "
                                       r"got 'triton'"):
    _sparse(impl="triton")
  with pytest.raises(ValueError, match=r"^impl: expected one of \('auto', 'recorded', 'pallas', 'xla'\), got 'chunk'"):
    product_key_address(**_address_inputs(), k=4, impl="chunk")


@pytest.mark.parametrize("config, field, value", [
    (PallasConfig(), "chunk_size", 48), (PallasConfig(), "rows_dtype", "float16"),
    (PallasConfig(), "rows_segments", 0), (PallasConfig(), "table_dtype", jnp.int8),
    (PallasConfig(), "table_grad_dtype", "fp32"), (PallasConfig(), "launch", ((64, 8),)),
    (ChunkConfig(), "chunk_size", 0), (ChunkConfig(), "chunk_size", 16.0)])
def test_a_bad_option_is_refused_by_its_config(config, field, value):
  with pytest.raises(ValueError, match=rf"^{field}\b.*got"):
    dataclasses.replace(config, **{field: value})


def test_configs_hold_dtypes_by_name_so_a_default_given_as_a_dtype_is_the_default():
  assert PallasConfig(rows_dtype=jnp.bfloat16, table_dtype=jnp.float32, launch=((64, 8), (64, 8))) == \
      PallasConfig(rows_dtype="bfloat16")
  for impl in ("scan", "chunk"):  # an option at its default is what every implementation runs
    assert configure(impl, SPARSE, {"table_dtype": jnp.float32, "launch": None}).config == ChunkConfig()


def test_an_option_no_config_has_is_refused():
  with pytest.raises(ValueError, match=r"^table_dtyp: no config of \('pallas', 'chunk', 'scan'\) has this option"):
    configure("auto", SPARSE, {"table_dtyp": "bfloat16"})


def _names(names):
  """The pattern of a message's tuple of names."""
  return r"\(" + ", ".join(f"'{name}'" for name in names) + r"\)"


@pytest.mark.parametrize("field, registry", [("impl", delta_rule.IMPLEMENTATIONS), ("sdm.impl", SPARSE),
                                             ("sdm.address_impl", ADDRESS)])
def test_the_training_config_checks_impls_against_the_registries(field, registry):
  config = get_config("demo")
  *parent, name = field.split(".")
  (config.model.sdm if parent else config.model)[name] = "triton"
  with pytest.raises(ConfigError, match=rf"^config.model.{field}: expected one of {_names(('auto', *registry))}, "
                                        rf"got 'triton'"):
    check_config(config)
