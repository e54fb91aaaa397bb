"""Packed documents through the layers (DESIGN.md section 9): the causal conv, attention (full and sliding-window,
RoPE positions restarting per document) and the dense delta-rule layer on a row of two documents and padding equal
the same layer on each document alone -- outputs and the gradients of the input and every parameter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdm_jax.layers import Attention, CausalConv, DeltaMixer
from sdm_jax.layers import attention as attention_module
from sdm_jax.ops.validation import on_gpu
from sdm_jax.testing.errors import relative_error

WIDTH, L, PAD = 32, 11, 2  # two documents of L tokens, then PAD of padding: one row of T = 24 (chunk 16)
T = 2 * L + PAD
SEGMENT_IDS = jnp.asarray([[3] * L + [1] * L + [0] * PAD], jnp.int32)


def packed_and_alone(layer, seed, **packed_args):
  """(packed, alone): the layer's output, input gradient and parameter gradients of <y, cotangent> on the packed row
  [1, T] (cotangent 0 on padding) and on the two documents as a batch [2, L]."""
  graphdef, state = nnx.split(layer)
  x = jax.random.normal(jax.random.key(seed), (1, T, WIDTH), jnp.float32)
  cotangent = jax.random.normal(jax.random.key(seed + 1), (1, T, WIDTH), jnp.float32).at[:, 2 * L:].set(0.0)
  split = lambda a: jnp.concatenate([a[:, :L], a[:, L:2 * L]])

  def run(state, x, cotangent, **kwargs):
    y, vjp = jax.vjp(lambda state, x: nnx.merge(graphdef, state)(x, **kwargs), state, x)
    return (y, *vjp(cotangent))

  packed = jax.jit(lambda s, x, c, ids: run(s, x, c, segment_ids=ids, **packed_args))(state, x, cotangent,
                                                                                      SEGMENT_IDS)
  alone = jax.jit(run)(state, split(x), split(cotangent))
  return packed, alone


def assert_packed_equals_alone(packed, alone, tol):
  (y, d_state, d_x), (y_alone, d_state_alone, d_x_alone) = packed, alone
  join = lambda a: jnp.concatenate([a[:1], a[1:]], axis=1)
  assert relative_error(y[:, :2 * L], join(y_alone)) < tol
  assert relative_error(d_x[:, :2 * L], join(d_x_alone)) < tol
  assert not np.any(np.asarray(d_x[:, 2 * L:])), "padding's input gradient is not exactly 0"
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(d_state), jax.tree.leaves(d_state_alone)):
    assert relative_error(a, b) < tol, jax.tree_util.keystr(path)


def test_causal_conv_does_not_see_across_documents():
  conv = CausalConv(WIDTH, kernel_size=4, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (1, T, WIDTH), jnp.float32)
  y = conv(x, SEGMENT_IDS)
  np.testing.assert_allclose(y[0, :L], conv(x[:, :L])[0], rtol=0, atol=1e-6)
  np.testing.assert_allclose(y[0, L:2 * L], conv(x[:, L:2 * L])[0], rtol=0, atol=1e-6)
  np.testing.assert_array_equal(conv(x, jnp.ones((1, T), jnp.int32)), conv(x))  # one document: unmasked


@pytest.mark.parametrize("window, conv_size", [(None, 0), (4, 0), (None, 3)])
def test_attention_masks_across_documents(window, conv_size):
  layer = Attention(WIDTH, num_heads=2, head_dim=8, window=window, conv_size=conv_size, rngs=nnx.Rngs(0))
  assert_packed_equals_alone(*packed_and_alone(layer, 2), 1e-5)


def test_attention_takes_positions():
  """Given positions are what RoPE rotates by: the default (per document) and explicit ones agree, and positions
  shifted by a constant per document leave the output unchanged up to rounding (RoPE is relative)."""
  layer = Attention(WIDTH, num_heads=2, head_dim=8, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(3), (1, T, WIDTH), jnp.float32)
  positions = jnp.asarray([list(range(L)) * 2 + [0] * PAD], jnp.int32)
  y = layer(x, SEGMENT_IDS)
  np.testing.assert_array_equal(layer(x, SEGMENT_IDS, positions), y)
  assert relative_error(layer(x, SEGMENT_IDS, positions + 5)[:, :2 * L], y[:, :2 * L]) < 1e-5
  assert relative_error(layer(x, SEGMENT_IDS, jnp.arange(T)[None])[:, :2 * L], y[:, :2 * L]) < 1e-5


@pytest.mark.skipif(not on_gpu(), reason="cuDNN flash attention runs on the GPU")
@pytest.mark.parametrize("window", (None, 128), ids=("full", "sliding"))
def test_packed_cudnn_matches_xla_at_bf16(window, monkeypatch):
  """cuDNN takes the documents' mask as an additive [B, 1, T, T] bias; the xla path as a mask."""
  layer = Attention(256, num_heads=4, head_dim=128, window=window, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(layer)
  x = jax.random.normal(jax.random.key(5), (2, 512, 256), jnp.bfloat16)
  ids = jnp.asarray(np.repeat(np.arange(1, 9), 64)[None].repeat(2, 0) * np.r_[[1] * 500 + [0] * 12])
  run = lambda: jax.jit(lambda s, x: jax.vjp(lambda s, x: nnx.merge(graphdef, s)(x, ids), s, x)[1](
      jnp.ones(x.shape, jnp.bfloat16)))
  assert "__cudnn$fmha" in jax.jit(lambda s, x: nnx.merge(graphdef, s)(x, ids)).lower(state, x).as_text()
  cudnn = run()(state, x)
  monkeypatch.setattr(attention_module, "flash_implementation", lambda dtype, head_dim: "xla")
  xla = run()(state, x)
  for a, b in zip(jax.tree.leaves(cudnn), jax.tree.leaves(xla)):
    assert relative_error(a, b) < 2e-2


def test_delta_layer_restarts_at_documents():
  layer = DeltaMixer(WIDTH, mixer="kda", num_heads=2, head_dim=16, value_dim=8, impl="scan", chunk_size=16,
                     rngs=nnx.Rngs(0))
  assert_packed_equals_alone(*packed_and_alone(layer, 4), 1e-5)
