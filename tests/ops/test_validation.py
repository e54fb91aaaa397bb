"""Bad input raises ValueError naming the argument (SPEC section 5); nothing is silently broadcast.

The messages are matched on the argument's name only, as a whole word, so their wording is free.
"""

import jax.numpy as jnp
import pytest

from helpers import GATES, MIXERS, call, make_inputs, seed_of, value_dim

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
                  for name in ("k", "v", "g") + tuple(n for n, _ in GATES[mixer]) for axis in (0, 1, 2)]


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


@pytest.mark.parametrize("mixer, name, size", [("kda", "g", K + 1), ("fg2", "beta", K + 1), ("fg2_plus", "beta_k", K + 1),
                                               ("fg2_plus", "beta_v", V + 1), ("gdn2", "b", K + 1),
                                               ("gdn2", "w", V + 1)])
def test_wrong_channel_dim_of_a_gate(mixer, name, size):
  inputs = _inputs(mixer)
  with pytest.raises(ValueError, match=_word(name)):
    call(mixer, {**inputs, name: _reshaped(inputs[name], -1, size)})


def test_fg2_gdn_requires_key_dim_equal_value_dim():
  inputs = make_inputs("fg2", B, T, H, K, V, 0.1, "random", seed_of("fg2 K != V"))
  with pytest.raises(ValueError, match=r"(?i)\b[kv]\b"):
    call("fg2", inputs)


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_integer_dtype(name):
  inputs = _inputs("gdn")
  with pytest.raises(ValueError, match=_word(name)):
    call("gdn", {**inputs, name: inputs[name].astype(jnp.int32)})


def test_unknown_impl():
  with pytest.raises(ValueError, match=_word("impl")):
    call("gdn2", _inputs("gdn2"), impl="triton")


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
