"""Multi-head Latent Attention: the layer against MLA written out with per-head keys and values materialised and a
plain softmax (fp64, outputs and gradients), prefill + absorbed steps against the full forward, packed documents
against each document alone, causality, a cache of the latent's size holding the latent, and its argument checks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdm_jax.layers import MultiHeadLatentAttention
from sdm_jax.layers import attention as attention_module
from sdm_jax.layers import mla as mla_module
from sdm_jax.ops.validation import on_gpu
from sdm_jax.testing.errors import relative_error

B, T, WIDTH, H = 2, 12, 32, 2
# qk head 8 + 4 = 12 against v 6: the training path pads v; DIMS_WIDE_V pads q and k instead.
DIMS = dict(num_heads=H, kv_lora_rank=10, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
DIMS_WIDE_V = dict(DIMS, v_head_dim=16)


def mla(seed=0, **kwargs):
  """A layer with random RMSNorm scales (ones would hide a norm applied in the wrong place)."""
  layer = MultiHeadLatentAttention(WIDTH, **{**DIMS, **kwargs}, rngs=nnx.Rngs(seed))
  key = jax.random.key(seed + 100)
  for norm in [layer.kv_proj.layers[1]] + ([layer.q_proj.layers[1]] if layer.q_lora_rank else []):
    key, sub = jax.random.split(key)
    norm.scale[...] = jax.random.uniform(sub, norm.scale.shape, jnp.float32, 0.5, 2.0)
  return layer


def inputs(seed, shape=(B, T, WIDTH)):
  return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def naive_mla(params, x, *, num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, q_lora_rank,
              window, positions, eps=1e-5):
  """MLA from the parameters (nnx.to_pure_dict) as DeepSeek-V2 writes it: every head's key [k_nope_h | k_rope] and
  value formed from the latent, RoPE (rotate-half) on the decoupled parts, then for each query t a softmax over the
  keys s in (t - window, t] of one document (equal `positions` - t restarts mark documents here); x's dtype
  throughout (fp64 under the x64 fixture)."""
  del kv_lora_rank
  B, T, _ = x.shape
  kernel = lambda *path: functools.reduce(lambda node, key: node[key], path, params)["kernel"].astype(x.dtype)
  norm = lambda y, *path: (y / jnp.sqrt(jnp.mean(y * y, -1, keepdims=True) + eps)
                           * functools.reduce(lambda node, key: node[key], path, params)["scale"].astype(x.dtype))

  def rope(y):  # y: [B, T, heads, D]
    D = y.shape[-1]
    angle = positions.astype(x.dtype)[:, :, None, None] * 1e4 ** (-2 * jnp.arange(D // 2, dtype=x.dtype) / D)
    y1, y2 = y[..., :D // 2], y[..., D // 2:]
    return jnp.concatenate([y1 * jnp.cos(angle) - y2 * jnp.sin(angle), y2 * jnp.cos(angle) + y1 * jnp.sin(angle)], -1)

  if q_lora_rank is None:
    q = x @ kernel("q_proj")
  else:
    q = norm(x @ kernel("q_proj", "layers", 0), "q_proj", "layers", 1) @ kernel("q_proj", "layers", 2)
  q = q.reshape(B, T, num_heads, qk_nope_head_dim + qk_rope_head_dim)
  q = jnp.concatenate([q[..., :qk_nope_head_dim], rope(q[..., qk_nope_head_dim:])], -1)
  latent = norm(x @ kernel("kv_proj", "layers", 0), "kv_proj", "layers", 1)
  kv = (latent @ kernel("kv_proj", "layers", 2)).reshape(B, T, num_heads, qk_nope_head_dim + v_head_dim)
  k_rope = rope((x @ kernel("k_rope"))[:, :, None])
  k = jnp.concatenate([kv[..., :qk_nope_head_dim], jnp.repeat(k_rope, num_heads, axis=2)], -1)  # per head, full
  v = kv[..., qk_nope_head_dim:]
  t, s = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
  document = jnp.cumsum(positions == 0, axis=1)  # [B, T]
  visible = (s <= t) & (t - s < (T if window is None else window)) & (document[:, :, None] == document[:, None, :])
  scores = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(qk_nope_head_dim + qk_rope_head_dim)
  weights = jax.nn.softmax(jnp.where(visible[:, None], scores, -jnp.inf), axis=-1)
  o = jnp.einsum("bhts,bshd->bthd", weights, v)
  return o.reshape(B, T, -1) @ kernel("o_proj")


def outputs_and_grads(layer, x, cotangent, **kwargs):
  """The layer's y = layer(x, **kwargs) and the gradients of <y, cotangent> w.r.t. x and the parameters."""
  graphdef, state = nnx.split(layer)

  @jax.jit
  def run(state, x, kwargs):
    y, vjp = jax.vjp(lambda state, x: nnx.merge(graphdef, state)(x, **kwargs), state, x)
    return y, vjp(cotangent.astype(y.dtype))

  y, (grad_state, grad_x) = run(state, x, kwargs)
  return y, grad_x, nnx.to_pure_dict(grad_state)


def reference_outputs_and_grads(layer, x, cotangent, positions):
  """naive_mla's y and gradients in fp64 (under the x64 fixture) at the layer's parameters."""
  to_fp64 = lambda a: jnp.asarray(a, jnp.float64)
  params = jax.tree.map(to_fp64, nnx.to_pure_dict(nnx.state(layer)))
  dims = {name: getattr(layer, name) for name in ("num_heads", "kv_lora_rank", "qk_nope_head_dim",
                                                  "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "window")}
  reference = functools.partial(naive_mla, **dims, positions=positions)
  y, vjp = jax.vjp(reference, params, to_fp64(x))
  grad_params, grad_x = vjp(to_fp64(cotangent))
  return y, grad_x, grad_params


def assert_matches_reference(actual, reference, tol):
  (y, grad_x, grad_params), (ref_y, ref_grad_x, ref_grad_params) = actual, reference
  errors = {"y": relative_error(y, ref_y), "grad x": relative_error(grad_x, ref_grad_x)}
  flat_ref = dict(jax.tree_util.tree_leaves_with_path(ref_grad_params))
  for path, grad in jax.tree_util.tree_leaves_with_path(grad_params):
    errors[jax.tree_util.keystr(path)] = relative_error(grad, flat_ref[path])
  assert len(errors) == 2 + len(flat_ref)
  assert max(errors.values()) <= tol, errors


@pytest.mark.parametrize("q_lora_rank", (None, 10), ids=("q_full", "q_lora"))
@pytest.mark.parametrize("dims", (DIMS, DIMS_WIDE_V), ids=("pad_v", "pad_qk"))
@pytest.mark.parametrize("window", (None, 5), ids=("full", "sliding"))
def test_matches_materialised_heads_with_gradients(window, dims, q_lora_rank, x64):
  layer = mla(1, **dims, q_lora_rank=q_lora_rank, window=window)
  x, cotangent = inputs(2), inputs(3)
  actual = outputs_and_grads(layer, x, cotangent)
  assert actual[0].dtype == jnp.float32
  reference = reference_outputs_and_grads(layer, x, cotangent, jnp.broadcast_to(jnp.arange(T), (B, T)))
  assert_matches_reference(actual, reference, 1e-5)


def test_packed_documents_match_the_reference_with_gradients(x64):
  """Two documents and a third cut short in each row, positions restarting at each: the reference masks by
  document explicitly."""
  layer = mla(4, q_lora_rank=10)
  segment_ids = jnp.asarray([[1] * 5 + [2] * 4 + [3] * 3, [7] * 2 + [8] * 10], jnp.int32)
  positions = jnp.asarray([list(range(5)) + list(range(4)) + list(range(3)), list(range(2)) + list(range(10))])
  x, cotangent = inputs(5), inputs(6)
  actual = outputs_and_grads(layer, x, cotangent, segment_ids=segment_ids)
  assert_matches_reference(actual, reference_outputs_and_grads(layer, x, cotangent, positions), 1e-5)


@pytest.mark.parametrize("window", (None, 4), ids=("full", "sliding"))
def test_packed_documents_equal_each_document_alone(window):
  layer, L = mla(7, window=window), 5
  segment_ids = jnp.asarray([[3] * L + [1] * L + [0] * 2], jnp.int32)  # two documents, then padding
  x = inputs(8, (1, 2 * L + 2, WIDTH))
  y = layer(x, segment_ids)
  alone = layer(jnp.concatenate([x[:, :L], x[:, L:2 * L]]))
  assert relative_error(y[0, :L], alone[0]) < 1e-6 and relative_error(y[0, L:2 * L], alone[1]) < 1e-6
  # Without the segment ids the second document sees the first: the mask is what separates them.
  assert relative_error(layer(x)[0, L:2 * L], alone[1]) > 1e-2


@pytest.mark.parametrize("window, prompt", [(None, 5), (None, 1), (4, 5), (3, 1)])
@pytest.mark.parametrize("q_lora_rank", (None, 10), ids=("q_full", "q_lora"))
def test_prefill_then_steps_equal_the_full_forward(window, prompt, q_lora_rank):
  """prefill on the first tokens, then one absorbed step per token (jitted once, traced positions): the outputs
  equal the training forward on the whole sequence. A window of 4 or 3 wraps the ring buffer."""
  layer, x = mla(9, q_lora_rank=q_lora_rank, window=window), inputs(10)
  y_prefill, cache = layer.prefill(x[:, :prompt], max_len=T)
  graphdef, state = nnx.split(layer)
  step = jax.jit(lambda state, x_t, cache, position: nnx.merge(graphdef, state).step(x_t, cache, position))
  ys = [y_prefill]
  for t in range(prompt, T):
    y_t, cache = step(state, x[:, t], cache, jnp.int32(t))
    ys.append(y_t[:, None])
  full = layer(x)
  decoded = jnp.concatenate(ys, axis=1)
  assert relative_error(decoded, full) < 1e-5
  assert float(jnp.abs(decoded - full).max()) < 1e-5


def test_steps_from_an_empty_cache_equal_the_full_forward():
  layer, x = mla(11, v_head_dim=16), inputs(12)
  cache, ys = layer.init_cache(B, T), []
  for t in range(T):
    y_t, cache = layer.step(x[:, t], cache, t)
    ys.append(y_t)
  assert relative_error(jnp.stack(ys, 1), layer(x)) < 1e-5


@pytest.mark.parametrize("window", (None, 4), ids=("full", "sliding"))
def test_causal(window):
  layer, x, t = mla(13, window=window), inputs(14), 7
  out, out_changed = layer(x), layer(x.at[:, t].add(1.0))
  np.testing.assert_allclose(out_changed[:, :t], out[:, :t], rtol=0, atol=1e-6)
  assert float(jnp.abs(out_changed[:, t] - out[:, t]).max()) > 1e-4


def test_sliding_window_forgets_tokens_outside_the_window():
  window, t = 4, 3
  layer, x = mla(15, window=window), inputs(16)
  out, out_changed = layer(x), layer(x.at[:, t].add(1.0))
  np.testing.assert_allclose(out_changed[:, t + window:], out[:, t + window:], rtol=0, atol=1e-6)
  assert float(jnp.abs(out_changed[:, t + window - 1] - out[:, t + window - 1]).max()) > 1e-4


@pytest.mark.parametrize("window, max_len, slots", [(None, 20, 20), (4, 20, 4), (32, 20, 20)])
@pytest.mark.parametrize("dtype", (jnp.float32, jnp.bfloat16))
def test_the_cache_is_the_latents_size(window, max_len, slots, dtype):
  """Per cached token kv_lora_rank + qk_rope_head_dim numbers, not H x (K + V); L = min(window, max_len) tokens."""
  layer = MultiHeadLatentAttention(WIDTH, **DIMS, window=window, dtype=dtype, rngs=nnx.Rngs(17))
  expected = {"latent": (B, slots, DIMS["kv_lora_rank"]), "k_rope": (B, slots, DIMS["qk_rope_head_dim"])}
  for cache in (layer.init_cache(B, max_len), layer.prefill(inputs(18).astype(dtype), max_len)[1]):
    assert {name: a.shape for name, a in cache.items()} == expected
    assert all(a.dtype == dtype for a in cache.values())


def test_the_cache_holds_the_normed_latent_and_the_rotated_shared_key():
  """After prefill with a window of 4, slot p % 4 holds RMSNorm(W_dkv x_p) and RoPE(W_kr x_p) of the last 4 tokens."""
  layer, x, window = mla(19, window=4), inputs(20), 4
  _, cache = layer.prefill(x, max_len=T + 8)
  down = np.asarray(x @ layer.kv_proj.layers[0].kernel[...], np.float64)
  latent = down / np.sqrt(np.mean(down**2, -1, keepdims=True) + 1e-5) * np.asarray(layer.kv_proj.layers[1].scale[...])
  k_rope = attention_module.rotary((x @ layer.k_rope.kernel[...])[:, :, None])[:, :, 0]
  for p in range(T - window, T):
    np.testing.assert_allclose(cache["latent"][:, p % window], latent[:, p], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cache["k_rope"][:, p % window], k_rope[:, p], rtol=1e-5, atol=1e-6)


def test_without_rope_positions_do_not_matter():
  """rope_base=None (NoPE): any positions give the same output; with RoPE, positions that are not a shift of
  0 .. T - 1 change it."""
  x, positions = inputs(21), jnp.broadcast_to(2 * jnp.arange(T) + 3, (B, T))
  nope = mla(21, rope_base=None)
  np.testing.assert_array_equal(nope(x, positions=positions), nope(x))
  rope = mla(21)
  assert relative_error(rope(x, positions=positions), rope(x)) > 1e-3


def test_bf16_is_within_1e_2_of_the_reference(x64):
  layer = MultiHeadLatentAttention(WIDTH, **DIMS, q_lora_rank=10, dtype=jnp.bfloat16, rngs=nnx.Rngs(22))
  x, cotangent = inputs(23).astype(jnp.bfloat16), inputs(24)
  y, grad_x, _ = outputs_and_grads(layer, x, cotangent)
  assert y.dtype == jnp.bfloat16
  ref_y, ref_grad_x, _ = reference_outputs_and_grads(layer, x, cotangent, jnp.broadcast_to(jnp.arange(T), (B, T)))
  assert relative_error(y, ref_y) < 1e-2 and relative_error(grad_x, ref_grad_x) < 1e-2


@pytest.mark.parametrize("kwargs, argument", [
    (dict(num_heads=0), "num_heads"), (dict(kv_lora_rank=0), "kv_lora_rank"), (dict(kv_lora_rank=8.0), "kv_lora_rank"),
    (dict(qk_nope_head_dim=0), "qk_nope_head_dim"), (dict(v_head_dim=-1), "v_head_dim"),
    (dict(qk_rope_head_dim=3), "qk_rope_head_dim"), (dict(qk_rope_head_dim=0), "qk_rope_head_dim"),
    (dict(q_lora_rank=0), "q_lora_rank"), (dict(window=0), "window"), (dict(num_heads=True), "num_heads"),
    (dict(rope_base=0.0), "rope_base"), (dict(norm_eps=0.0), "norm_eps")])
def test_bad_dimensions_raise(kwargs, argument):
  with pytest.raises(ValueError, match=f"^{argument}: "):
    MultiHeadLatentAttention(WIDTH, **{**DIMS, **kwargs}, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="^width: "):
    MultiHeadLatentAttention(0, **DIMS, rngs=nnx.Rngs(0))


def test_bad_inputs_raise():
  layer, x = mla(25), inputs(26)
  with pytest.raises(ValueError, match="^x: .*width 32"):
    layer(x[..., :16])
  with pytest.raises(ValueError, match="^x: "):
    layer(x[0])
  with pytest.raises(ValueError, match="^segment_ids: .*shape"):
    layer(x, jnp.ones((B, T - 1), jnp.int32))
  with pytest.raises(ValueError, match="^segment_ids: .*integer"):
    layer(x, jnp.ones((B, T), jnp.float32))
  with pytest.raises(ValueError, match="^max_len: .*12"):
    layer.prefill(x, max_len=T - 1)


def lowered_text(layer, x, segment_ids):
  graphdef, state = nnx.split(layer)
  return jax.jit(lambda state, x, ids: nnx.merge(graphdef, state)(x, ids)).lower(state, x, segment_ids).as_text()


@pytest.mark.skipif(not on_gpu(), reason="cuDNN flash attention runs on the GPU")
@pytest.mark.parametrize("packed", (False, True), ids=("unpacked", "packed"))
def test_cudnn_matches_xla_at_bf16(packed, monkeypatch):
  """DeepSeek-V2's head shape (128 + 64 for q and k, 128 for v, padded to 192): cuDNN's flash attention runs and
  agrees with the xla path."""
  layer = MultiHeadLatentAttention(256, num_heads=2, kv_lora_rank=256, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                   v_head_dim=128, q_lora_rank=192, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  x, cotangent = inputs(27, (2, 512, 256)).astype(jnp.bfloat16), inputs(28, (2, 512, 256))
  segment_ids = jnp.repeat(jnp.asarray([[1, 2, 3, 4]], jnp.int32), 128, axis=1).repeat(2, axis=0) if packed else None
  assert attention_module.flash_implementation(jnp.bfloat16, 192) == "cudnn"
  assert "__cudnn$fmha" in lowered_text(layer, x, segment_ids)
  cudnn = outputs_and_grads(layer, x, cotangent, segment_ids=segment_ids)
  monkeypatch.setattr(mla_module, "flash_implementation", lambda dtype, head_dim: "xla")
  assert "__cudnn$fmha" not in lowered_text(layer, x, segment_ids)
  xla = outputs_and_grads(layer, x, cotangent, segment_ids=segment_ids)
  errors = {"y": relative_error(cudnn[0], xla[0]), "grad x": relative_error(cudnn[1], xla[1])}
  assert max(errors.values()) < 1e-2, errors
