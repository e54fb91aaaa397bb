"""Bad input raises ValueError naming the argument (DESIGN.md section 5); nothing is silently broadcast.

The messages are matched on the argument's name only, as a whole word, so their wording is free.
Also the default impl "auto": the chunk (or xla) program off the GPU, "pallas" when the backend is a GPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdm_jax import ops
from sdm_jax.ops import product_key_address, sparse_delta_rule
from sdm_jax.ops.delta_rule import IMPLEMENTATIONS
from sdm_jax.ops.sparse_delta import IMPLEMENTATIONS as SPARSE_IMPLEMENTATIONS
from sdm_jax.ops.validation import on_gpu
from sdm_jax.testing.inputs import make_inputs, seed_of
from sdm_jax.testing.runs import MIXERS, arg_names, call, value_dim

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


@pytest.mark.skipif(on_gpu(), reason="what impl='auto' picks off the GPU")
@pytest.mark.parametrize("mixer", MIXERS)
def test_auto_is_chunk_off_the_gpu(mixer):
  inputs = _inputs(mixer)
  run = lambda x, **options: call(mixer, x, output_final_state=True, **options)
  assert _same_program(run, inputs, {"impl": "chunk"})
  assert not _same_program(run, inputs, {"impl": "scan"})  # the comparison tells impls apart


@pytest.mark.skipif(on_gpu(), reason="what impl='auto' picks off the GPU")
def test_sparse_auto_is_chunk_and_address_auto_is_xla_off_the_gpu():
  sparse = lambda x, **options: sparse_delta_rule(**x, output_final_state=True, **options)
  assert _same_program(sparse, _sparse_inputs(seed_of("sdm auto")), {"impl": "chunk"})
  address = lambda x, **options: product_key_address(**x, k=4, **options)
  assert _same_program(address, _address_inputs(seed_of("address auto")), {"impl": "xla"})


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


# Issue 22: empty dimensions, oversized chunk sizes, arguments of the wrong kind, index checks under jit.
EMPTY_SHAPES = [(B, 0, H), (0, T, H), (B, T, 0)]  # (B, T, H) with one of them 0


@pytest.mark.parametrize("mixer", MIXERS)
def test_an_empty_dimension_gives_an_empty_result_for_every_impl(mixer):
  """T = 0: o [B, 0, H, V] and the initial state back (zeros without one); B = 0, H = 0: empty arrays of the
  right shapes. The chunked and Pallas forms used to fail padding an empty T (ZeroDivisionError, a slice error)."""
  Vm = value_dim(mixer, K, V)
  for shape in EMPTY_SHAPES:
    inputs = make_inputs(mixer, *shape, K, Vm, 0.1, "random", seed_of("empty", mixer, shape))
    for impl in IMPLEMENTATIONS:
      o, state = call(mixer, inputs, impl=impl, output_final_state=True)
      assert o.shape == (*shape, Vm) and o.dtype == inputs["v"].dtype, (shape, impl)
      np.testing.assert_array_equal(state, inputs["initial_state"])
  o, state = call(mixer, _inputs(mixer, initial_state=None) | {
      name: x[:, :0] for name, x in _inputs(mixer).items() if name != "initial_state"}, output_final_state=True)
  assert o.shape == (B, 0, H, Vm)
  np.testing.assert_array_equal(state, np.zeros((B, H, K, Vm)))


def test_an_empty_dimension_of_the_generalized_rule_and_the_sparse_op():
  rng = np.random.default_rng(seed_of("empty rule"))
  state = jnp.asarray(rng.normal(size=(B, H, K, V)), jnp.float32)
  for impl in IMPLEMENTATIONS:
    q, u, e = (jnp.ones((B, 0, H, K)) for _ in range(3))
    o, final = ops.generalized_delta_rule(q, u, e, jnp.ones((B, 0, H, V)), -jnp.ones((B, 0, H)),
                                          initial_state=state, impl=impl)
    assert o.shape == (B, 0, H, V)
    np.testing.assert_array_equal(final, state)
  for impl in SPARSE_IMPLEMENTATIONS:
    for axis in (0, 1, 2):  # B, T, H
      inputs = _sparse_inputs(seed_of("empty sdm", axis), **{"BTH"[axis]: 0})
      o, table = sparse_delta_rule(**inputs, impl=impl, output_final_state=True)
      assert o.shape == inputs["v"].shape
      batch = inputs["v"].shape[0]
      np.testing.assert_array_equal(table, jnp.broadcast_to(inputs["m0"], (batch, *inputs["m0"].shape)))


def _jaxpr(fn, inputs, **options):
  return str(jax.make_jaxpr(lambda x: fn(x, **options))(inputs))


def test_an_oversized_chunk_size_runs_as_the_padded_length():
  """T = 5 pads to one chunk of 16, whatever chunk_size asks: 4096 traces to the program of 16 (without the
  clamp, a 4096 x 4096 gram per chunk)."""
  dense = lambda x, **options: call("gdn2", x, impl="chunk", **options)
  assert _jaxpr(dense, _inputs("gdn2"), chunk_size=4096) == _jaxpr(dense, _inputs("gdn2"), chunk_size=16)
  sparse = lambda x, **options: sparse_delta_rule(**x, impl="chunk", **options)
  inputs = _sparse_inputs(seed_of("clamp"))
  assert _jaxpr(sparse, inputs, chunk_size=4096) == _jaxpr(sparse, inputs, chunk_size=16)


@pytest.mark.parametrize("chunk_size", [True, 2.0, "64"])
def test_a_chunk_size_that_is_not_an_integer(chunk_size):
  with pytest.raises(ValueError, match=_word("chunk_size")):
    call("gdn2", _inputs("gdn2"), chunk_size=chunk_size)
  with pytest.raises(ValueError, match=_word("chunk_size")):
    sparse_delta_rule(**_sparse_inputs(0), chunk_size=chunk_size)


def test_a_scale_that_is_not_a_number():
  with pytest.raises(ValueError, match=_word("scale")):
    call("kda", _inputs("kda"), scale="x")
  np.testing.assert_array_equal(call("kda", _inputs("kda"), scale=jnp.float32(0.25), impl="scan")[0],
                                call("kda", _inputs("kda"), scale=0.25, impl="scan")[0])


@pytest.mark.parametrize("mixer, name", [("gdn", "q"), ("fg2_gdn", "k"), ("gdn2", "w"), ("kda", "initial_state")])
def test_an_input_that_is_not_an_array(mixer, name):
  inputs = _inputs(mixer)
  with pytest.raises(ValueError, match=_word(name)):
    call(mixer, {**inputs, name: np.asarray(inputs[name]).tolist()})


@pytest.mark.parametrize("name", ["m0", "k_idx", "v"])
def test_a_sparse_input_that_is_not_an_array(name):
  inputs = _sparse_inputs(0)
  with pytest.raises(ValueError, match=_word(name)):
    sparse_delta_rule(**{**inputs, name: np.asarray(inputs[name]).tolist()})


def test_sparse_indices_closed_over_by_a_jitted_function_are_checked_without_tracer_errors():
  """Concrete index arrays captured by jax.jit used to raise ConcretizationTypeError at the range check."""
  inputs = _sparse_inputs(seed_of("jit indices"))
  indices = {name: inputs.pop(name) for name in ("k_idx", "q_idx")}
  run = jax.jit(lambda floats: sparse_delta_rule(**floats, **indices, impl="scan")[0])
  np.testing.assert_allclose(run(inputs), sparse_delta_rule(**inputs, **indices, impl="scan")[0], rtol=1e-6)
  indices["k_idx"] = indices["k_idx"].at[1, 2, 0, 0].set(16)
  with pytest.raises(ValueError, match=_word("k_idx")):
    jax.jit(lambda floats: sparse_delta_rule(**floats, **indices, impl="scan")[0])(inputs)
