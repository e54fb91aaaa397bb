"""Attention (full and sliding-window), RoPE, and the small parts of a block: RMSNorm, the causal conv
and the pre-norm residual Block itself, each against a direct formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdm_jax.layers import Attention, Block, CausalConv, RMSNorm, rotary

B, T, WIDTH, H, D = 2, 12, 32, 2, 8


def attention(window, seed=0):
  return Attention(WIDTH, num_heads=H, head_dim=D, window=window, rngs=nnx.Rngs(seed))


def inputs(seed, shape=(B, T, WIDTH)):
  return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def test_window_covering_the_sequence_is_full_attention():
  x = inputs(1)
  np.testing.assert_allclose(attention(window=T)(x), attention(window=None)(x), rtol=0, atol=1e-6)
  assert float(jnp.abs(attention(window=T - 4)(x) - attention(window=None)(x)).max()) > 1e-3


def test_full_attention_matches_a_per_query_softmax():
  layer, x = attention(window=None), inputs(2)
  q = np.asarray(rotary(layer.q_proj(x).reshape(B, T, H, D)), np.float64)
  k = np.asarray(rotary(layer.k_proj(x).reshape(B, T, H, D)), np.float64)
  v = np.asarray(layer.v_proj(x).reshape(B, T, H, D), np.float64)
  rows = []
  for t in range(T):
    scores = np.einsum("bhd,bshd->bhs", q[:, t], k[:, :t + 1]) / np.sqrt(D)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    rows.append(np.einsum("bhs,bshd->bhd", w, v[:, :t + 1]).reshape(B, -1))
  expected = layer.o_proj(jnp.asarray(np.stack(rows, 1), jnp.float32))
  np.testing.assert_allclose(layer(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", (None, 4), ids=("full", "sliding"))
def test_causal(window):
  layer, x, t = attention(window), inputs(3), 7
  out = layer(x)
  out_changed = layer(x.at[:, t].add(1.0))
  np.testing.assert_allclose(out_changed[:, :t], out[:, :t], rtol=0, atol=1e-6)
  assert float(jnp.abs(out_changed[:, t] - out[:, t]).max()) > 1e-4


def test_sliding_window_forgets_tokens_outside_the_window():
  window, t = 4, 3
  layer, x = attention(window), inputs(4)
  out, out_changed = layer(x), layer(x.at[:, t].add(1.0))
  np.testing.assert_allclose(out_changed[:, t + window:], out[:, t + window:], rtol=0, atol=1e-6)
  assert float(jnp.abs(out_changed[:, t + window - 1] - out[:, t + window - 1]).max()) > 1e-4


def test_rotary_scores_depend_only_on_relative_position():
  q, k = inputs(5, (1, 1, 1, D)), inputs(6, (1, 1, 1, D))
  at = lambda x, pos: rotary(jnp.broadcast_to(x, (1, 16, 1, D)))[0, pos, 0]
  score = lambda m, n: float(jnp.dot(at(q, m), at(k, n)))
  assert score(5, 2) == pytest.approx(score(12, 9), rel=1e-5)
  assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)


def test_rms_norm():
  norm, x = RMSNorm(WIDTH), inputs(7)
  norm.scale[...] = jnp.linspace(0.5, 2.0, WIDTH)
  expected = x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + 1e-6) * np.linspace(0.5, 2.0, WIDTH)
  np.testing.assert_allclose(norm(x), expected, rtol=1e-5, atol=1e-6)


def test_causal_conv_matches_numpy_convolve():
  conv, x = CausalConv(3, kernel_size=4, rngs=nnx.Rngs(0)), inputs(8, (1, T, 3))
  kernel = np.asarray(conv.kernel[...])
  # np.convolve flips its second argument; kernel[-1] multiplies the current token.
  expected = np.stack([np.convolve(x[0, :, c], kernel[::-1, c])[:T] for c in range(3)], -1)
  np.testing.assert_allclose(conv(x)[0], expected, rtol=1e-5, atol=1e-6)


def test_block_is_two_pre_norm_residuals():
  mixer = attention(window=None)
  block = Block(mixer, WIDTH, mlp_hidden=48, rngs=nnx.Rngs(1))
  x = inputs(9)
  h = x + mixer(block.mixer_norm(x))
  expected = h + block.mlp(block.mlp_norm(h))
  np.testing.assert_allclose(block(x), expected, rtol=1e-5, atol=1e-6)
