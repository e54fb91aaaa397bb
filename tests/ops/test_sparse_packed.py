"""sparse_delta_rule with segment_ids (DESIGN.md section 9): a packed row equals its documents run alone by the float64
scan -- outputs, the final table of each row's last document and the gradient of every input, m0 included (shared
and per batch row) -- for impl="scan", "chunk" (documents starting inside a chunk and at a chunk start) and
"pallas" (interpret mode, also with rows segments and a bf16 table);
padding gives 0 and gets exactly zero gradient; a row that is one document is the unpacked op.

The documents alone run as one batch of rows, each from its row's m0 and followed by inert tokens (k_w, v, g, beta
and q_w 0: the scan writes the rows it found and reads 0, bit for bit). The packed forward kernel gets no table (its
table is an output alone), and interpret mode fills such an output with NaN: a row read before any token of its
document wrote it would show here as NaN.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdm_jax.ops import sparse_delta_rule
from sdm_jax.ops.validation import on_gpu
from sdm_jax.testing.errors import FP32_TOL, relative_error
from sdm_jax.testing.inputs import segment_ids

B, T, H, N, V, W = 2, 40, 2, 64, 32, 16
# (start, end) per document, ids 1, 2, ... in order. Row 0: documents of 1, 12, 1 and 13 tokens, then 13 of padding:
# with rows_segments=3 (bounds 13 and 26) a document starts at a bound and one spans a bound; three documents meet in
# one chunk of 8 (tokens 8-15). Row 1: 24 tokens, then 16 (a start at a chunk start for chunk_size 8).
LAYOUT = (((0, 1), (1, 13), (13, 14), (14, 27)), ((0, 24), (24, 40)))
DOCUMENTS = [(row, start, end) for row, docs in enumerate(LAYOUT) for start, end in docs]
L = max(end - start for _, start, end in DOCUMENTS)
FLOATS = ("m0", "k_w", "v", "g", "beta", "q_w")
PER_TOKEN = FLOATS[1:]


def _inputs(seed, shared):
  """Small N so that documents share slots; g between -0.05 and -1 so that what a document leaves decays slowly."""
  rng = np.random.default_rng(seed)
  x = dict(
      m0=rng.normal(size=(H, N, V) if shared else (B, H, N, V)),
      k_idx=rng.integers(0, N, size=(B, T, H, W)),
      k_w=rng.dirichlet(np.ones(W), size=(B, T, H)),
      v=rng.normal(size=(B, T, H, V)),
      g=-rng.uniform(0.05, 1.0, size=(B, T, H)),
      beta=rng.uniform(size=(B, T, H)),
      q_idx=rng.integers(0, N, size=(B, T, H, W)),
      q_w=rng.dirichlet(np.ones(W), size=(B, T, H)),
  )
  return x, rng.normal(size=(B, T, H, V)), rng.normal(size=(B, H, N, V))


def _loss_and_grads(x, r_o, r_s, dtype, **kw):
  """(o, final table, {name: gradient}) of sum(o r_o) + sum(final r_s)."""
  ints = {k: jnp.asarray(x[k]) for k in ("k_idx", "q_idx")}

  def loss(floats):
    o, table = sparse_delta_rule(**floats, **ints, output_final_state=True, **kw)
    return jnp.sum(o * jnp.asarray(r_o, o.dtype)) + jnp.sum(table * jnp.asarray(r_s, table.dtype)), (o, table)

  grads, (o, table) = jax.jit(jax.grad(loss, has_aux=True))({k: jnp.asarray(x[k], dtype) for k in FLOATS})
  return np.asarray(o), np.asarray(table), {k: np.asarray(v) for k, v in grads.items()}


def _alone(x, row, start, end):
  """x[row, start:end] as one row of L tokens, zeros after."""
  return np.pad(x[row:row + 1, start:end], [(0, 0), (0, L - (end - start))] + [(0, 0)] * (x.ndim - 2))


@functools.lru_cache(maxsize=None)
def _reference(seed, shared):
  """The documents alone (float64 scan, unpacked) in the packed layout: o, each row's last final table, every
  per-token gradient (0 on padding) and d m0 summed over the documents that start from it."""
  x, r_o, r_s = _inputs(seed, shared)
  last = [max(i for i, d in enumerate(DOCUMENTS) if d[0] == row) for row in range(B)]
  alone = {k: np.concatenate([_alone(x[k], *d) for d in DOCUMENTS]) for k in x if k != "m0"}
  alone["m0"] = x["m0"] if shared else x["m0"][[row for row, _, _ in DOCUMENTS]]
  r_s_alone = np.stack([r_s[row] if i in last else np.zeros_like(r_s[0]) for i, (row, _, _) in enumerate(DOCUMENTS)])
  o, table, grads = _loss_and_grads(alone, np.concatenate([_alone(r_o, *d) for d in DOCUMENTS]), r_s_alone,
                                    jnp.float64, impl="scan")

  def packed(y):
    out = np.zeros((B, T) + y.shape[2:])
    for i, (row, start, end) in enumerate(DOCUMENTS):
      out[row, start:end] = y[i, :end - start]
    return out

  expected = {"o": packed(o), "final": table[last], **{f"d_{k}": packed(grads[k]) for k in PER_TOKEN}}
  if shared:
    expected["d_m0"] = grads["m0"]
  else:
    expected["d_m0"] = np.stack([sum(grads["m0"][i] for i, d in enumerate(DOCUMENTS) if d[0] == row)
                                 for row in range(B)])
  return expected


@pytest.mark.parametrize("impl,shared,options", [
    ("scan", True, {}), ("scan", False, {}),
    # Per-row m0 here; the shared one's gathers are in test_one_document_is_the_unpacked_op.
    ("chunk", False, {"chunk_size": 8}),
    ("pallas", True, {}),
    # Rows segments bounds at 13 and 26: inside a document, at a document start and inside a document that spans one.
    ("pallas", False, {"rows_segments": 3}),
])
def test_packed_row_equals_documents_alone(x64, impl, shared, options):
  seed = 1 if shared else 2
  x, r_o, r_s = _inputs(seed, shared)
  ids = segment_ids(LAYOUT, B, T)
  dtype = jnp.float64 if impl == "scan" else jnp.float32
  o, final, grads = _loss_and_grads(x, r_o, r_s, dtype, impl=impl, segment_ids=ids, **options)
  expected = _reference(seed, shared)
  actual = {"o": o, "final": final, **{f"d_{k}": v for k, v in grads.items()}}
  tol_out, tol_grad = (1e-12, 1e-12) if impl == "scan" else FP32_TOL[impl]
  errors = {k: relative_error(actual[k], expected[k]) for k in expected}
  assert all(errors[k] < (tol_out if k in ("o", "final") else tol_grad) for k in expected), errors
  padding = np.asarray(ids) == 0
  for k in ("o",) + tuple(f"d_{k}" for k in PER_TOKEN):
    assert not np.any(actual[k][padding]), f"{k} is not exactly 0 on padding"
  if impl == "pallas":  # without gradients the forward kernel saves no rows: a path of its own
    args = {k: jnp.asarray(v) if k.endswith("idx") else jnp.asarray(v, dtype) for k, v in x.items()}
    o, final = jax.jit(lambda a: sparse_delta_rule(**a, impl=impl, output_final_state=True, segment_ids=ids,
                                                   **options))(args)
    assert relative_error(o, expected["o"]) < tol_out and relative_error(final, expected["final"]) < tol_out


def test_packed_bf16_table_near_documents_alone(x64):
  """table_dtype="bfloat16" (its rows bf16 too) with packed documents and rows segments: the documents alone at bf16's
  distance (1.5e-3 to 2.7e-3 measured here)."""
  x, r_o, r_s = _inputs(1, True)
  o, final, grads = _loss_and_grads(x, r_o, r_s, jnp.float32, impl="pallas", segment_ids=segment_ids(LAYOUT, B, T),
                                    table_dtype="bfloat16", rows_segments=2)
  expected = _reference(1, True)
  actual = {"o": o, "final": final, **{f"d_{k}": v for k, v in grads.items()}}
  errors = {k: relative_error(actual[k], expected[k]) for k in expected}
  assert all(1e-4 < e < 1e-2 for e in errors.values()), errors


def test_packed_kernels_read_m0_in_the_table_dtype(monkeypatch):
  """With a bf16 table the packed kernels get m0 in bf16 (half the bytes of its stale rows): the same bits as m0 in
  fp32, which the kernels round to bf16 as they load it (forward, the replay of a rows segment, backward)."""
  from sdm_jax.ops import sparse_pallas
  x, r_o, r_s = _inputs(2, True)
  run = lambda: _loss_and_grads(x, r_o, r_s, jnp.float32, impl="pallas", segment_ids=segment_ids(LAYOUT, B, T),
                                table_dtype="bfloat16", rows_segments=2)
  calls = []
  stale_rows = sparse_pallas._stale_rows
  monkeypatch.setattr(sparse_pallas, "_stale_rows", lambda *a: calls.append(stale_rows(*a).dtype) or stale_rows(*a))
  o, final, grads = run()
  assert calls and all(dtype == jnp.bfloat16 for dtype in calls), calls
  monkeypatch.setattr(sparse_pallas, "_stale_rows", lambda m0, packed, dtype: None if packed is None else m0)
  o32, final32, grads32 = run()
  assert np.array_equal(o, o32) and np.array_equal(final, final32)
  for k in grads:
    assert np.array_equal(grads[k], grads32[k]), k


@pytest.mark.parametrize("impl", ["scan", "chunk", "pallas"])
def test_one_document_is_the_unpacked_op(impl):
  """Rows that are one document each (ids 3 and 1): the unpacked op, bit for bit (forward; m0 shared). The packed
  chunked form is another program (slot versions), which XLA's GPU backend may reduce in another order: there it
  is held to 1e-6 (on the CPU it is bit for bit too)."""
  x, _, _ = _inputs(4, True)
  args = {k: jnp.asarray(v) if k.endswith("idx") else jnp.asarray(v, jnp.float32) for k, v in x.items()}
  ids = jnp.asarray(np.array([[3] * T, [1] * T], np.int32))
  packed = sparse_delta_rule(**args, impl=impl, output_final_state=True, segment_ids=ids)
  plain = sparse_delta_rule(**args, impl=impl, output_final_state=True)
  for a, b in zip(packed, plain):
    if impl == "chunk" and on_gpu():
      assert relative_error(a, b) < 1e-6
    else:
      assert np.array_equal(a, b)


@pytest.mark.parametrize("segment_ids,match", [
    (np.ones((B, T), np.float32), "segment_ids.*integer"),
    (np.ones((B, T + 1), np.int32), r"segment_ids.*\[B, T\]"),
    (np.ones((T,), np.int32), r"segment_ids.*\[B, T\]"),
])
def test_bad_segment_ids_raise(segment_ids, match):
  x, _, _ = _inputs(5, True)
  args = {k: jnp.asarray(v) if k.endswith("idx") else jnp.asarray(v, jnp.float32) for k, v in x.items()}
  with pytest.raises(ValueError, match=match):
    sparse_delta_rule(**args, impl="scan", segment_ids=jnp.asarray(segment_ids))


@pytest.mark.parametrize("one_key", [True, False])
def test_packed_codes_mark_what_each_run_wrote(one_key):
  """The pallas path's index coding (`sparse_pallas._codes`, with its one-key and two-key sorts of all rows and heads
  at once) against its definition, token by token in every row and head: a write index is fresh where its run wrote
  the slot at an earlier token, a read index where its run wrote it at this token or an earlier one; N small so that
  slots repeat within and across tokens, rows and heads (a row's writes must not count for another's)."""
  from sdm_jax.ops.sparse_pallas import _codes
  B, H, Tc, n = 2, 2, 30, 12
  rng = np.random.default_rng(6)
  k, q = rng.integers(0, n, (B, H, Tc, 4)), rng.integers(0, n, (B, H, Tc, 3))
  run_start = np.zeros((B, Tc), np.int32)
  for b, starts in enumerate([(0, 7, 8, 19), (0, 13)]):
    for s in starts:
      run_start[b, s:] = s
  k_code, q_code = map(np.asarray, _codes(jnp.asarray(k, jnp.int32), jnp.asarray(q, jnp.int32),
                                          jnp.asarray(run_start), N=n, one_key=one_key))
  for b, h, t in np.ndindex(B, H, Tc):
    written = lambda last: set(k[b, h, run_start[b, t]:last].reshape(-1))
    assert [c >= 0 for c in k_code[b, h, t]] == [s in written(t) for s in k[b, h, t]], (b, h, t)
    assert [c >= 0 for c in q_code[b, h, t]] == [s in written(t + 1) for s in q[b, h, t]], (b, h, t)
    assert np.array_equal(np.where(k_code[b, h, t] < 0, ~k_code[b, h, t], k_code[b, h, t]), k[b, h, t])
    assert np.array_equal(np.where(q_code[b, h, t] < 0, ~q_code[b, h, t], q_code[b, h, t]), q[b, h, t])
