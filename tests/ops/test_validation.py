"""Bad input raises ValueError naming the argument (SPEC section 5); nothing is silently broadcast.

The messages are matched on the argument's name only, as a whole word, so their wording is free.
Also the default impl "auto": the chunk (or xla) program off the GPU, "pallas" when the backend is a GPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import MIXERS, arg_names, call, make_inputs, seed_of, value_dim
from sdm_jax.ops import product_key_address, sparse_delta_rule
from sdm_jax.ops.product_key import ADDRESS_IMPLS
from sdm_jax.ops.validation import IMPLS, resolve_impl

B, T, H, K, V = 2, 5, 2, 16, 32


def _inputs(mixer, **overrides):
  inputs = make_inputs(mixer, B, T, H, K, value_dim(mixer, K, V), 0.1, "random", seed_of("validation", mixer))
  return {**inputs, **overrides}


def _reshaped(x, axis, size):
  shape = list(x.shape)
  shape[axis] = size
  return jnp.full(shape, 0.5, x.dtype)


def _word(name):
  return rf"\b{name}\b"


def test_wrong_rank_of_q():
  inputs = _inputs("gdn")
  with pytest.raises(ValueError, match=_word("q")):
    call("gdn", {**inputs, "q": inputs["q"][..., 0]})


@pytest.mark.parametrize("mixer, name", [("gdn", "g"), ("gdn", "beta"), ("kda", "beta")])
def test_per_channel_gate_where_a_per_head_one_is_expected(mixer, name):
  inputs = _inputs(mixer)
  with pytest.raises(ValueError, match=_word(name)):
    call(mixer, {**inputs, name: jnp.broadcast_to(inputs[name][..., None], (B, T, H, K))})


BTH_MISMATCHES = [(mixer, name, axis) for mixer in MIXERS
                  for name in arg_names(mixer)[1:] for axis in (0, 1, 2)]


@pytest.mark.parametrize("mixer, name, axis", BTH_MISMATCHES)
def test_mismatched_batch_time_heads(mixer, name, axis):
  inputs = _inputs(mixer)
  x = inputs[name]
  with pytest.raises(ValueError, match=_word(name)):
    call(mixer, {**inputs, name: _reshaped(x, axis, x.shape[axis] + 1)})


def test_size_one_batch_is_not_broadcast():
  inputs = _inputs("gdn")
  with pytest.raises(ValueError, match=_word("beta")):
    call("gdn", {**inputs, "beta": inputs["beta"][:1]})


def test_mismatched_key_dim_between_q_and_k():
  inputs = _inputs("kda")
  with pytest.raises(ValueError, match=r"\b[qk]\b"):  # either side of the mismatch may be named
    call("kda", {**inputs, "k": _reshaped(inputs["k"], -1, K + 1)})


@pytest.mark.parametrize("mixer, name, size", [("kda", "g", K + 1), ("fg2_gdn", "beta", K + 1),
                                               ("fg2_gdn_plus", "beta_k", K + 1),
                                               ("fg2_gdn_plus", "beta_v", V + 1), ("gdn2", "b", K + 1),
                                               ("gdn2", "w", V + 1)])
def test_wrong_channel_dim_of_a_gate(mixer, name, size):
  inputs = _inputs(mixer)
  with pytest.raises(ValueError, match=_word(name)):
    call(mixer, {**inputs, name: _reshaped(inputs[name], -1, size)})


def test_fg2_gdn_requires_key_dim_equal_value_dim():
  inputs = make_inputs("fg2_gdn", B, T, H, K, V, 0.1, "random", seed_of("fg2 K != V"))
  with pytest.raises(ValueError, match=r"(?i)\b[kv]\b"):
    call("fg2_gdn", inputs)


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_integer_dtype(name):
  inputs = _inputs("gdn")
  with pytest.raises(ValueError, match=_word(name)):
    call("gdn", {**inputs, name: inputs[name].astype(jnp.int32)})


def test_unknown_impl():
  with pytest.raises(ValueError, match=_word("impl")) as error:
    call("gdn2", _inputs("gdn2"), impl="triton")
  assert "'auto'" in str(error.value)


def _sparse_inputs(seed, B=2, T=5, H=2, N=16, V=8, W=3, R=2):
  rng = np.random.default_rng(seed)
  floats = dict(m0=rng.normal(size=(H, N, V)), k_w=rng.dirichlet(np.ones(W), size=(B, T, H)),
                v=rng.normal(size=(B, T, H, V)), g=-rng.uniform(0.1, 1.0, size=(B, T, H)),
                beta=rng.uniform(size=(B, T, H)), q_w=rng.dirichlet(np.ones(R), size=(B, T, H)))
  return ({k: jnp.asarray(x, jnp.float32) for k, x in floats.items()}
          | {"k_idx": jnp.asarray(rng.integers(0, N, (B, T, H, W))),
             "q_idx": jnp.asarray(rng.integers(0, N, (B, T, H, R)))})


def _address_inputs(seed, B=1, T=4, H=2, n=8, D=16):
  rng = np.random.default_rng(seed)
  shapes = {"x1": (B, T, H, D), "x2": (B, T, H, D), "c1": (H, n, D), "c2": (H, n, D)}
  return {name: jnp.asarray(rng.standard_normal(shape), jnp.float32) for name, shape in shapes.items()}


def test_unknown_impl_of_the_sparse_ops_lists_auto():
  with pytest.raises(ValueError, match=_word("impl")) as error:
    sparse_delta_rule(**_sparse_inputs(0), impl="triton")
  assert "'auto'" in str(error.value)
  with pytest.raises(ValueError, match=_word("impl")) as error:
    product_key_address(**_address_inputs(0), k=4, impl="chunk")
  assert "'auto'" in str(error.value)


def _same_program(fn, inputs, options):
  """Whether fn(inputs) with the default impl traces to the jaxpr of fn(inputs, **options): then its results are
  bitwise those of that impl (tracing only, no compile)."""
  default, explicit = (str(jax.make_jaxpr(lambda x: fn(x, **kw))(inputs)) for kw in ({}, options))
  return default == explicit


@pytest.mark.parametrize("mixer", MIXERS)
def test_auto_is_chunk_off_the_gpu(mixer):
  assert jax.default_backend() != "gpu"
  inputs = _inputs(mixer)
  run = lambda x, **options: call(mixer, x, output_final_state=True, **options)
  assert _same_program(run, inputs, {"impl": "chunk"})
  assert not _same_program(run, inputs, {"impl": "scan"})  # the comparison tells impls apart


def test_sparse_auto_is_chunk_and_address_auto_is_xla_off_the_gpu():
  assert jax.default_backend() != "gpu"
  sparse = lambda x, **options: sparse_delta_rule(**x, output_final_state=True, **options)
  assert _same_program(sparse, _sparse_inputs(seed_of("sdm auto")), {"impl": "chunk"})
  address = lambda x, **options: product_key_address(**x, k=4, **options)
  assert _same_program(address, _address_inputs(seed_of("address auto")), {"impl": "xla"})


def test_auto_resolves_to_pallas_on_a_gpu(monkeypatch):
  assert resolve_impl("auto") == "chunk" and resolve_impl("auto", ADDRESS_IMPLS, fallback="xla") == "xla"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert resolve_impl("auto") == "pallas"
  assert resolve_impl("auto", ADDRESS_IMPLS, fallback="xla") == "pallas"
  assert [resolve_impl(impl) for impl in IMPLS] == list(IMPLS)  # an explicit impl is never replaced


@pytest.mark.parametrize("chunk_size", [48, 0])
def test_chunk_size_not_a_power_of_two(chunk_size):
  with pytest.raises(ValueError, match=_word("chunk_size")):
    call("gdn2", _inputs("gdn2"), chunk_size=chunk_size)


@pytest.mark.parametrize("shape", [(B, H, V, K), (H, K, V), (B + 1, H, K, V)], ids=["KV-swapped", "no-batch", "batch"])
def test_initial_state_with_wrong_shape(shape):
  with pytest.raises(ValueError, match=_word("initial_state")):
    call("gdn2", _inputs("gdn2", initial_state=jnp.ones(shape, jnp.float32)))


@pytest.mark.parametrize("chunk_size", [8, 128])  # 128: its backward does not fit the H200's shared memory
def test_pallas_rejects_a_chunk_size_its_kernels_lack(chunk_size):
  with pytest.raises(ValueError, match=_word("chunk_size")):
    call("gdn2", _inputs("gdn2"), impl="pallas", chunk_size=chunk_size)
