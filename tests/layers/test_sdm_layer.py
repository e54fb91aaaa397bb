"""The Sparse Delta Memory layer: shapes, scan == chunk, impl-free parameters, causality, decay init,
and gradients that reach the initial table, both sub-key tables and every projection."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdm_jax.layers import SparseDeltaMemory
from sdm_jax.layers.decay import A_RANGE, DT_RANGE
from sdm_jax.testing.errors import relative_error

B, T, WIDTH, H, N, W, R, KEY_DIM, V = 2, 20, 32, 2, 64, 4, 3, 8, 8


def make_layer(impl, seed=0, address_impl="xla"):
  return SparseDeltaMemory(WIDTH, num_heads=H, num_slots=N, topk_write=W, topk_read=R, key_dim=KEY_DIM, value_dim=V,
                           impl=impl, chunk_size=8, address_impl=address_impl, rngs=nnx.Rngs(seed))


@functools.lru_cache(maxsize=None)
def forward(impl, address_impl="xla"):
  graphdef, state = nnx.split(make_layer(impl, address_impl=address_impl))
  run = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
  return lambda x: run(state, x)


def inputs(seed):
  return jax.random.normal(jax.random.key(seed), (B, T, WIDTH), jnp.float32)


def test_parameter_shapes_and_impl_independence():
  scan, chunk = (nnx.state(make_layer(impl), nnx.Param) for impl in ("scan", "chunk"))
  assert jax.tree.structure(scan) == jax.tree.structure(chunk)
  for a, b in zip(jax.tree.leaves(scan), jax.tree.leaves(chunk)):
    np.testing.assert_array_equal(a, b)
  assert chunk["m0"].shape == (H, N, V)
  assert chunk["sub_keys_1"].shape == chunk["sub_keys_2"].shape == (H, 8, KEY_DIM)  # sqrt(N) rows
  assert float(jnp.std(chunk["m0"][...])) < 0.05


def test_chunk_matches_scan():
  x = inputs(1)
  ref, out = forward("scan")(x), forward("chunk")(x)
  assert out.shape == (B, T, WIDTH) and bool(jnp.all(jnp.isfinite(out)))
  assert relative_error(out, ref) <= 1e-5


def test_the_pallas_addressing_kernel_finds_the_same_slots():
  """address_impl="pallas" (interpret mode here): the layer's output and its gradients as with XLA's top-k."""
  x = inputs(4)

  def loss_and_grads(address_impl):
    graphdef, state = nnx.split(make_layer("chunk", address_impl=address_impl))
    loss = lambda state: jnp.sum(nnx.merge(graphdef, state)(x) ** 2)
    return jax.jit(jax.value_and_grad(loss))(state)

  (loss, grads), (loss_xla, grads_xla) = loss_and_grads("pallas"), loss_and_grads("xla")
  np.testing.assert_allclose(loss, loss_xla, rtol=1e-6)
  # The kernel's scores are the same fp32 dot products summed in another order: each gradient within fp32 rounding.
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    g_xla = np.asarray(dict(jax.tree_util.tree_leaves_with_path(grads_xla))[path])
    assert relative_error(g, g_xla) <= 1e-5, jax.tree_util.keystr(path)


def test_causal():
  t = 11
  x = inputs(2)
  x_changed = x.at[:, t].add(jax.random.normal(jax.random.key(3), (B, WIDTH)))
  out, out_changed = forward("chunk")(x), forward("chunk")(x_changed)
  np.testing.assert_allclose(out_changed[:, :t], out[:, :t], rtol=0, atol=1e-6)
  assert float(jnp.abs(out_changed[:, t] - out[:, t]).max()) > 1e-4


def test_decay_init_ranges():
  decay = make_layer("chunk").decay
  assert decay.A_log.shape == decay.dt_bias.shape == (H,)
  a, dt = np.exp(decay.A_log[...]), np.asarray(jax.nn.softplus(decay.dt_bias[...]))
  assert A_RANGE[0] <= a.min() and a.max() <= A_RANGE[1]
  assert DT_RANGE[0] * (1 - 1e-5) <= dt.min() and dt.max() <= DT_RANGE[1] * (1 + 1e-5)


def test_gradients_reach_every_parameter():
  layer = make_layer("chunk")
  x = inputs(4)
  r = jax.random.normal(jax.random.key(5), (B, T, WIDTH))
  grads = nnx.jit(nnx.grad(lambda layer, x: jnp.sum(layer(x) * r)))(layer, x)
  flat = {"/".join(map(str, path)): np.asarray(leaf[...]) for path, leaf in nnx.to_flat_state(grads)}
  expected = {"m0", "sub_keys_1", "sub_keys_2", "write_query_proj/kernel", "read_query_proj/kernel", "v_proj/kernel",
              "decay/f_proj/kernel", "decay/A_log", "decay/dt_bias", "b_proj/kernel", "o_norm/scale",
              "out_gate_proj/kernel", "o_proj/kernel"}
  assert set(flat) == expected
  for name, g in flat.items():
    assert np.all(np.isfinite(g)), name
    assert np.abs(g).max() > 0, name


def test_num_slots_must_be_a_square():
  with pytest.raises(ValueError, match="num_slots"):
    SparseDeltaMemory(WIDTH, num_heads=H, num_slots=60, topk_write=W, topk_read=R, key_dim=KEY_DIM, value_dim=V,
                      rngs=nnx.Rngs(0))


def _layer_with(impl, **options):
  return SparseDeltaMemory(WIDTH, num_heads=H, num_slots=N, topk_write=W, topk_read=R, key_dim=KEY_DIM, value_dim=V,
                           impl=impl, rngs=nnx.Rngs(0), **options)


def test_the_ops_options_are_checked_when_the_layer_is_built():
  with pytest.raises(ValueError, match=r"^table_dtype: an option of impl='pallas'"):
    _layer_with("chunk", table_dtype="bfloat16")
  with pytest.raises(ValueError, match=r"^rows_segments: expected an int >= 1, got 0"):
    _layer_with("auto", rows_segments=0)
  with pytest.raises(ValueError, match=r"^table_dtyp: no config"):
    _layer_with("auto", table_dtyp="bfloat16")


def test_decoding_runs_the_scan_without_the_pallas_options():
  """The options are the layer's impl's: a step (the scan) runs without them, from the cache prefill leaves."""
  layer = _layer_with("pallas", table_dtype="bfloat16", rows_segments=2)
  x = inputs(5)
  _, cache = layer.prefill(x[:, :3])
  y, cache = layer.step(x[:, 3], cache)
  reference = _layer_with("scan")
  _, expected = reference.prefill(x[:, :3])
  expected_y, _ = reference.step(x[:, 3], expected)
  assert y.shape == (B, WIDTH) and cache["M"].dtype == jnp.float32
  # The prefill ran the bf16 table, the step the fp32 scan: the outputs agree to bf16's rounding of the table.
  assert relative_error(y, expected_y) <= 1e-2
