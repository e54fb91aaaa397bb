"""Attention (full and sliding-window), RoPE, and the small parts of a block: RMSNorm, the causal conv
and the pre-norm residual Block itself, each against a direct formula. Attention's output and gradients also
against a dense masked softmax in fp64, and on the GPU its cuDNN flash attention against the xla path."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdm_jax.layers import Attention, Block, CausalConv, RMSNorm, rotary
from sdm_jax.layers import attention as attention_module
from sdm_jax.ops.validation import on_gpu
from sdm_jax.testing.errors import relative_error

B, T, WIDTH, H, D = 2, 12, 32, 2, 8


def attention(window, seed=0):
  return Attention(WIDTH, num_heads=H, head_dim=D, window=window, rngs=nnx.Rngs(seed))


def inputs(seed, shape=(B, T, WIDTH)):
  return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def dense_attention(params, x, window, head_dim=D):
  """The layer written out from its parameters (nnx.to_pure_dict): RoPE, then for each query t a softmax over
  the scores of the keys s in (t - window, t], all in x's dtype (fp64 under the x64 fixture)."""
  B, T, _ = x.shape
  project = lambda name: (x @ params[name]["kernel"].astype(x.dtype)).reshape(B, T, -1, head_dim)
  inv_freq = 1e4 ** (-2 * jnp.arange(head_dim // 2, dtype=x.dtype) / head_dim)
  angle = jnp.arange(T, dtype=x.dtype)[:, None, None] * inv_freq  # [T, 1, head_dim / 2]

  def rope(y):
    y1, y2 = jnp.split(y, 2, axis=-1)
    return jnp.concatenate([y1 * jnp.cos(angle) - y2 * jnp.sin(angle), y2 * jnp.cos(angle) + y1 * jnp.sin(angle)], -1)

  q, k, v = rope(project("q_proj")), rope(project("k_proj")), project("v_proj")
  t, s = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
  visible = (s <= t) & (t - s < (T if window is None else window))
  scores = jnp.where(visible, jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(head_dim), -jnp.inf)
  o = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)
  return o.reshape(B, T, -1) @ params["o_proj"]["kernel"].astype(x.dtype)


def outputs_and_grads(layer, x, cotangent):
  """The layer's y = layer(x) and the gradients of <y, cotangent> w.r.t. x and the parameters (a pure dict)."""
  graphdef, state = nnx.split(layer)

  @jax.jit
  def run(state, x):
    y, vjp = jax.vjp(lambda state, x: nnx.merge(graphdef, state)(x), state, x)
    return y, vjp(cotangent.astype(y.dtype))

  y, (grad_state, grad_x) = run(state, x)
  return y, grad_x, nnx.to_pure_dict(grad_state)


@functools.partial(jax.jit, static_argnames=("window", "head_dim"))
def dense_outputs_and_grads(params, x, cotangent, window, head_dim):
  y, vjp = jax.vjp(functools.partial(dense_attention, window=window, head_dim=head_dim), params, x)
  grad_params, grad_x = vjp(cotangent)
  return y, grad_x, grad_params


def reference_outputs_and_grads(layer, x, cotangent):
  """dense_attention's y and gradients in fp64 (under the x64 fixture) at the layer's parameters."""
  to_fp64 = lambda a: jnp.asarray(a, jnp.float64)
  params = jax.tree.map(to_fp64, nnx.to_pure_dict(nnx.state(layer)))
  return dense_outputs_and_grads(params, to_fp64(x), to_fp64(cotangent), layer.window, layer.head_dim)


def assert_matches_reference(actual, reference, tol, weight_tol=None):
  """y and the gradient w.r.t. x within tol of the reference, the weights' gradients within weight_tol (tol)."""
  (y, grad_x, grad_params), (ref_y, ref_grad_x, ref_grad_params) = actual, reference
  errors = {"y": relative_error(y, ref_y), "grad x": relative_error(grad_x, ref_grad_x)}
  assert max(errors.values()) <= tol, errors
  weight_errors = {name: relative_error(grad_params[name]["kernel"], ref_grad_params[name]["kernel"])
                   for name in ref_grad_params}
  assert max(weight_errors.values()) <= (tol if weight_tol is None else weight_tol), weight_errors


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


# window < T and window == T (plain causal attention); T = 13 is not a power of two (nor a multiple of the window).
@pytest.mark.parametrize("window, length", [(None, 16), (5, 16), (16, 16), (None, 13), (5, 13)])
def test_matches_dense_attention_with_gradients(window, length, x64):
  layer, x, cotangent = attention(window), inputs(10, (B, length, WIDTH)), inputs(11, (B, length, WIDTH))
  actual = outputs_and_grads(layer, x, cotangent)
  assert actual[0].dtype == jnp.float32
  assert_matches_reference(actual, reference_outputs_and_grads(layer, x, cotangent), tol=1e-5)


@pytest.mark.parametrize("window", (None, 5), ids=("full", "sliding"))
def test_bf16_is_within_1e_2_of_dense_attention(window, x64):
  layer = Attention(WIDTH, num_heads=H, head_dim=D, window=window, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  x, cotangent = inputs(12, (B, 16, WIDTH)).astype(jnp.bfloat16), inputs(13, (B, 16, WIDTH))
  actual = outputs_and_grads(layer, x, cotangent)
  assert actual[0].dtype == jnp.bfloat16
  # The projections' weight gradients are bf16 matmuls over B * T rows: 8e-3 to 1e-2 here, as with the
  # [T, T] masked softmax this layer used before.
  assert_matches_reference(actual, reference_outputs_and_grads(layer, x, cotangent), tol=1e-2, weight_tol=2e-2)


def lowered_text(layer, x):
  graphdef, state = nnx.split(layer)
  return jax.jit(lambda state, x: nnx.merge(graphdef, state)(x)).lower(state, x).as_text()


@pytest.mark.skipif(not on_gpu(), reason="cuDNN flash attention runs on the GPU")
@pytest.mark.parametrize("window", (None, 128), ids=("full", "sliding"))
def test_cudnn_matches_xla_at_bf16(window, monkeypatch):
  layer = Attention(256, num_heads=4, head_dim=128, window=window, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  x, cotangent = inputs(14, (2, 512, 256)).astype(jnp.bfloat16), inputs(15, (2, 512, 256))
  assert attention_module.flash_implementation(jnp.bfloat16, 128) == "cudnn"
  assert attention_module.flash_implementation(jnp.float32, 128) == "xla"
  assert "__cudnn$fmha" in lowered_text(layer, x)
  cudnn = outputs_and_grads(layer, x, cotangent)
  monkeypatch.setattr(attention_module, "flash_implementation", lambda dtype, head_dim: "xla")
  assert "__cudnn$fmha" not in lowered_text(layer, x)
  xla = outputs_and_grads(layer, x, cotangent)
  assert_matches_reference(cudnn, xla, tol=1e-2, weight_tol=2e-2)


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


@pytest.mark.parametrize("conv_size", [-1, 1])
def test_a_convolution_of_fewer_than_two_taps_is_refused(conv_size):
  with pytest.raises(ValueError, match=f"conv_size: expected 0 .* got {conv_size}"):
    Attention(32, num_heads=2, head_dim=8, conv_size=conv_size, rngs=nnx.Rngs(0))
