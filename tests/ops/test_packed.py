"""Packed sequences (DESIGN.md section 9): a row of documents given segment_ids equals every document run alone by
the float64 scan -- outputs, final states and every gradient -- for every mixer and impl (pallas in interpret
mode); padding is inert with output 0 and exactly zero gradient; the initial state goes to each row's first
document.

The documents alone run as one batch of rows, each document from the start of its row and followed by zero
tokens (q, k, v, g and the gates 0). Those are exactly inert in the scan -- u = e = z = 0 and g = 0 leave the
state bit for bit, q = 0 reads 0 -- so each row is its document alone, and one compilation serves them all.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdm_jax import ops
from sdm_jax.ops.segments import cu_seqlens_to_segment_ids, document_index, document_positions
from sdm_jax.testing.errors import FP32_TOL, assert_close, results
from sdm_jax.testing.inputs import cotangents, make_inputs, seed_of, segment_ids
from sdm_jax.testing.runs import MIXERS, arg_names, call, loss, value_dim

B, T, H, K, V, C = 2, 46, 1, 16, 32, 16  # the last chunk is cut short: the impls pad it
# (start, end, id) per document. Row 0: documents of 1 and 20 tokens (across the chunk boundary at 16), 1, 10, and
# 13 starting exactly at the boundary 32, then a token of padding. Row 1: 15, then 30 from chunk position 15
# across two boundaries, then 1 (the row's last token); its ids repeat, apart, as two documents.
LAYOUT = (((0, 1, 1), (1, 21, 2), (21, 22, 3), (22, 32, 4), (32, 45, 5)),
          ((0, 15, 7), (15, 45, 3), (45, 46, 7)))
DOCUMENTS = [(row, start, end) for row, docs in enumerate(LAYOUT) for start, end, _ in docs]
L = max(end - start for _, start, end in DOCUMENTS)


def _inputs(mixer):
  seed = seed_of("packed", mixer)
  inputs = make_inputs(mixer, B, T, H, K, value_dim(mixer, K, V), "mixed", "random", seed, jnp.float32)
  r_o, r_s = cotangents((B, T, H, value_dim(mixer, K, V)), (B, H, K, value_dim(mixer, K, V)), seed + 1)
  return inputs, r_o, r_s


def _alone(x, row, start, end):
  """x[row, start:end] as one row of L tokens, zeros after (numpy: no eager jax ops to compile)."""
  out = np.zeros((1, L) + x.shape[2:], x.dtype)
  out[0, :end - start] = x[row, start:end]
  return out


def _packed(x):
  """Rows of documents alone [len(DOCUMENTS), L, ...] back in the packed layout [B, T, ...], 0 on padding."""
  out = np.zeros((B, T) + x.shape[2:], x.dtype)
  for i, (row, start, end) in enumerate(DOCUMENTS):
    out[row, start:end] = x[i, :end - start]
  return out


@functools.lru_cache(maxsize=None)
def _reference(mixer):
  """The documents alone (float64 scan), put back in the packed layout: outputs, each row's last final state and
  every gradient, 0 on padding; d initial_state from each row's first document."""
  inputs, r_o, r_s = (jax.tree.map(lambda x: np.asarray(x, np.float64), a) for a in _inputs(mixer))
  names = arg_names(mixer)
  rows = np.array([row for row, _, _ in DOCUMENTS])
  first = np.array([min(i for i, d in enumerate(DOCUMENTS) if d[0] == row) for row in range(B)])
  last = np.array([max(i for i, d in enumerate(DOCUMENTS) if d[0] == row) for row in range(B)])
  alone = {name: np.concatenate([_alone(inputs[name], *d) for d in DOCUMENTS]) for name in names}
  alone["initial_state"] = np.zeros((len(DOCUMENTS),) + inputs["initial_state"].shape[1:])
  alone["initial_state"][first] = inputs["initial_state"]
  r_o_alone = np.concatenate([_alone(r_o, *d) for d in DOCUMENTS])
  r_s_alone = np.zeros((len(DOCUMENTS),) + r_s.shape[1:])
  r_s_alone[last] = r_s
  assert np.all(rows[first] == np.arange(B)) and np.all(rows[last] == np.arange(B))

  def objective(arrays, r_o, r_s):
    o, final_state = call(mixer, arrays, output_final_state=True, impl="scan", use_qk_l2norm=True)
    return loss(o, final_state, r_o, r_s), (o, final_state)

  grads, (o, final_state) = jax.jit(jax.grad(objective, has_aux=True))(alone, r_o_alone, r_s_alone)
  expected = {"o": _packed(np.asarray(o)), "final_state": np.asarray(final_state)[last]}
  expected.update({f"d_{name}": _packed(np.asarray(grads[name])) for name in names})
  expected["d_initial_state"] = np.asarray(grads["initial_state"])[first]
  return expected


# Without gradients the Pallas kernels form u, e, z themselves, a path of its own; packed, they also zero q and k on
# padding themselves (the path for gradients has XLA zero them), so two mixers check it: GDN (the scalar-decay grams)
# and GDN-2 (gates on both the key and the value side).
NO_GRAD_FORWARD = ("gdn", "gdn2")


@functools.lru_cache(maxsize=None)
def _packed_grad(mixer, impl):
  def objective(arrays, ids, r_o, r_s):
    o, final_state = call(mixer, arrays, output_final_state=True, impl=impl, chunk_size=C, use_qk_l2norm=True,
                          segment_ids=ids)
    return loss(o, final_state, r_o, r_s), (o, final_state)

  return jax.jit(jax.grad(objective, has_aux=True))


# The resets and masks do not depend on the mixer's build: the default suite runs the scan on a scalar-decay and a
# per-channel mixer and the Pallas kernels on those and GDN-2's three gates; `-m slow` runs every pair.
FAST = {"scan": ("gdn", "kda"), "chunk": tuple(MIXERS), "pallas": ("gdn", "kda", "gdn2")}


@pytest.mark.parametrize("mixer,impl", [
    pytest.param(mixer, impl, marks=() if mixer in FAST[impl] else pytest.mark.slow)
    for impl in FAST for mixer in MIXERS])
def test_packed_row_equals_documents_alone(x64, mixer, impl):
  inputs, r_o, r_s = _inputs(mixer)
  ids = segment_ids(LAYOUT, B, T)
  grads, (o, final_state) = _packed_grad(mixer, impl)(inputs, ids, r_o, r_s)
  actual = results(o, final_state, grads)
  tol_out, tol_grad = FP32_TOL.get(impl, FP32_TOL["chunk"])
  if impl == "pallas" and mixer in NO_GRAD_FORWARD:
    o_nograd, state_nograd = jax.jit(lambda a, s: call(mixer, a, output_final_state=True, impl=impl, chunk_size=C,
                                                        use_qk_l2norm=True, segment_ids=s))(inputs, ids)
    assert_close({"o": o_nograd, "final_state": state_nograd}, {n: _reference(mixer)[n] for n in ("o", "final_state")},
                 tol_out, f"{impl} packed forward without gradients, {mixer}")
    # There the kernels zero q and k on padding themselves: the output is exactly 0 too.
    assert not np.any(np.asarray(o_nograd)[np.asarray(ids) == 0]), "o without gradients is not exactly 0 on padding"
  expected = _reference(mixer)
  outputs = ("o", "final_state")
  assert_close({n: actual[n] for n in outputs}, {n: expected[n] for n in outputs}, tol_out, f"{impl} packed, {mixer}")
  assert_close({n: actual[n] for n in expected if n not in outputs}, {n: expected[n] for n in expected if n not in outputs},
               tol_grad, f"{impl} packed gradients, {mixer}")
  padding = np.asarray(ids) == 0
  for name in ("o",) + tuple(f"d_{n}" for n in arg_names(mixer)):
    assert not np.any(np.asarray(actual[name])[padding]), f"{name} is not exactly 0 on padding"


def test_cu_seqlens_to_segment_ids():
  np.testing.assert_array_equal(cu_seqlens_to_segment_ids(np.array([0, 1, 4, 6]), 6), [[1, 2, 2, 2, 3, 3]])
  np.testing.assert_array_equal(cu_seqlens_to_segment_ids(np.array([0, 5])), [[1] * 5])
  for bad in ([0, 3, 3, 6], [0, 4, 2, 6], [1, 3, 6], [0, 3, 5]):
    with pytest.raises(ValueError, match="cu_seqlens"):
      cu_seqlens_to_segment_ids(np.array(bad), 6)


def test_document_index_and_positions():
  ids = jnp.array([[4, 4, 2, 4, 4, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(document_index(ids), [[0, 0, 1, 2, 2, -1, -1], [0] * 7])
  np.testing.assert_array_equal(document_positions(ids), [[0, 1, 0, 0, 1, 0, 0], list(range(7))])


def test_bad_segment_ids_raise():
  inputs, _, _ = _inputs("kda")
  with pytest.raises(ValueError, match="segment_ids.*integer"):
    call("kda", inputs, segment_ids=jnp.ones((B, T), jnp.float32), impl="chunk")
  with pytest.raises(ValueError, match=r"segment_ids.*\[B, T\]"):
    call("kda", inputs, segment_ids=jnp.ones((B, T + 1), jnp.int32), impl="chunk")


def _leaky_build(k, v, beta):
  return k + beta, beta * k, v  # u does not vanish with k


def _writes_vanish_with_k(mixer):
  """Whether mixer.build gives u = e = 0 at k = 0, for random values and gates in (0, 1]."""
  rng = np.random.default_rng(0)
  shape = {"key": (1, 1, 1, 4), "value": (1, 1, 1, 4), "head": (1, 1, 1)}
  values = [jnp.asarray(rng.uniform(0.1, 1.0, shape[kind]), jnp.float32)
            for kind in ("value",) + tuple(kind for _, kind in mixer.gates)]
  u, e, _ = mixer.build(jnp.zeros(shape["key"], jnp.float32), *values)
  return not (np.any(np.asarray(u)) or np.any(np.asarray(e)))


def test_pallas_masks_only_q_and_k_where_the_mixer_allows_it():
  """impl="pallas" zeroes only q and k on padding for mixers whose u and e vanish with k (`writes_vanish_with_k`,
  checked here for every registered mixer); a mixer without it masks every input, and still equals the chunked
  path with padding inert."""
  from sdm_jax.ops.registry import Mixer, register
  for mixer in ops.MIXERS.values():
    assert mixer.writes_vanish_with_k == _writes_vanish_with_k(mixer), mixer.name
  leaky = register(Mixer("leaky", "leaky_rule", _leaky_build, decay="key", gates=(("beta", "key"),)))
  assert not leaky.writes_vanish_with_k and not _writes_vanish_with_k(leaky)
  try:
    inputs, r_o, r_s = _inputs("leaky")
    ids, names = segment_ids(LAYOUT, B, T), arg_names("leaky")
    runs = {}
    for impl in ("chunk", "pallas"):
      grads, (o, final_state) = _packed_grad("leaky", impl)(inputs, ids, r_o, r_s)
      runs[impl] = results(o, final_state, grads)
  finally:
    del ops.MIXERS[leaky.name]
  tol_out, tol_grad = FP32_TOL["pallas"]
  outputs = ("o", "final_state")
  assert_close({n: runs["pallas"][n] for n in outputs}, {n: runs["chunk"][n] for n in outputs}, tol_out, "leaky")
  grads = [n for n in runs["chunk"] if n not in outputs]
  assert_close({n: runs["pallas"][n] for n in grads}, {n: runs["chunk"][n] for n in grads}, tol_grad, "leaky grads")
  padding = np.asarray(ids) == 0
  for name in ("o",) + tuple(f"d_{n}" for n in names):
    assert not np.any(np.asarray(runs["pallas"][name])[padding]), f"{name} is not exactly 0 on padding"
