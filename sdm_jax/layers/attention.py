"""Causal softmax attention with rotary position embeddings, full or over a sliding window."""

import jax
import jax.numpy as jnp
from flax import nnx

from sdm_jax.layers.conv import CausalConv
from sdm_jax.ops.segments import document_index, document_positions
from sdm_jax.ops.validation import on_gpu


def rotary(x, base=10000.0, positions=None):
  """Rotates channel pairs (i, i + D/2) of x: [B, T, H, D] by angle p * base^(-2i/D) (RoPE, rotate-half form).

  positions: [T] or [B, T], the sequence index p of each token (default 0 .. T - 1).
  """
  T, D = x.shape[1], x.shape[-1]
  positions = jnp.arange(T) if positions is None else positions
  inv_freq = base ** (-jnp.arange(0, D // 2, dtype=jnp.float32) * 2 / D)
  angle = positions.astype(jnp.float32)[..., None] * inv_freq  # [(B,) T, D/2]
  cos, sin = jnp.cos(angle)[..., None, :], jnp.sin(angle)[..., None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def flash_implementation(dtype, head_dim):
  """The jax.nn.dot_product_attention implementation for q, k, v of this dtype and head_dim: "cudnn" (cuDNN's
  flash attention) where it takes them, else "xla".

  cuDNN's flash attention needs an NVIDIA GPU of compute capability >= 8.0 (cuDNN fused attention starts at
  Ampere), fp16 or bf16 inputs, and head_dim a multiple of 8, at most 256 from Hopper (9.0) on and 128 before
  (jax/_src/cudnn/fused_attention_stablehlo.py: check_layout, check_is_flash_attention).
  """
  if not on_gpu() or jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16) or head_dim % 8:
    return "xla"
  version = getattr(jax.devices()[0], "compute_capability", "")  # "9.0" on CUDA, "gfx90a" on ROCm
  if not version[:1].isdigit():
    return "xla"
  capability = tuple(int(n) for n in version.split("."))
  supported = capability >= (8, 0) and head_dim <= (256 if capability >= (9, 0) else 128)
  return "cudnn" if supported else "xla"


class Attention(nnx.Module):
  """Multi-head causal attention; token t sees s in (t - window, t], or all s <= t when window is None.

  x: [B, T, width] -> [B, T, width], through jax.nn.dot_product_attention (cuDNN's flash attention where
  flash_implementation picks it, never a [T, T] score matrix there). Scores and softmax in fp32.
  Packed documents (segment_ids [B, T], DESIGN.md section 9): a token sees only its own document (padding only
  padding), through a [B, 1, T, T] boolean mask, which cuDNN takes as an additive bias of that size (it reads it;
  the flash kernel still forms no score matrix); RoPE positions restart at every document unless given.
  For decoding, the cache holds the rotated keys and the values of the last L = min(window, max_len)
  tokens, {"k", "v"}: [B, L, H, head_dim], position p in slot p % L: a ring buffer that never wraps
  for full attention (L = max_len) and keeps exactly the window for sliding-window attention.

  conv_size: 0, or a short causal depthwise convolution of that many taps after each of the q, k, v projections
  (`conv.CausalConv`, no activation), as the attention baseline of Zoology's Based experiments: each token then
  holds the ones just before it, which plain attention must first learn a previous-token head for (MQAR's keys and
  values); its cache is the last conv_size - 1 projections ("conv": q, k, v).
  """

  def __init__(self, width, *, num_heads, head_dim, window=None, rope_base=10000.0, conv_size=0, dtype=jnp.float32,
               rngs):
    if head_dim % 2:
      raise ValueError(f"head_dim: RoPE rotates channel pairs, expected an even head_dim, got {head_dim}")
    if window is not None and window < 1:
      raise ValueError(f"window: expected a positive number of tokens or None, got {window}")
    if conv_size < 0 or conv_size == 1:
      raise ValueError(f"conv_size: expected 0 (no convolution) or at least 2 taps, got {conv_size}")
    linear = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, dtype=dtype, rngs=rngs)
    self.q_proj = linear(width, num_heads * head_dim)
    self.k_proj = linear(width, num_heads * head_dim)
    self.v_proj = linear(width, num_heads * head_dim)
    self.o_proj = linear(num_heads * head_dim, width)
    self.num_heads, self.head_dim, self.window, self.rope_base = num_heads, head_dim, window, rope_base
    conv = lambda: CausalConv(num_heads * head_dim, kernel_size=conv_size, dtype=dtype, rngs=rngs)
    self.convs = nnx.List([conv() for _ in range(3)]) if conv_size else None
    self.dtype = dtype

  def project(self, x, positions, segment_ids=None, conv_cache=None):
    """x: [B, T, width], positions: [T] or [B, T] -> (q, k (rotated), v: [B, T, H, head_dim], the convolutions'
    cache after x: None without them). conv_cache: the convolutions' inputs before x (None: none)."""
    B, T, _ = x.shape
    heads = lambda y: y.reshape(B, T, self.num_heads, self.head_dim)
    q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    if self.convs is not None:
      caches = conv_cache or [conv.init_cache(B) for conv in self.convs]
      (q, q_cache), (k, k_cache), (v, v_cache) = (conv.extend(y, cache, segment_ids)
                                                  for conv, y, cache in zip(self.convs, (q, k, v), caches))
      conv_cache = [q_cache, k_cache, v_cache]
    q = rotary(heads(q), self.rope_base, positions)
    k = rotary(heads(k), self.rope_base, positions)
    return q, k, heads(v), conv_cache

  def attend(self, q, k, v, segment_ids=None):
    """q, k, v: [B, T, H, head_dim] at positions 0 .. T - 1 -> y: [B, T, width]; segment_ids: None or [B, T]."""
    B, T = q.shape[:2]
    # local_window_size (left, right) lets t see s in [t - left, t + right]; cuDNN takes it as a window of
    # left + 1 tokens. A window covering the sequence is plain causal attention.
    window = None if self.window is None or self.window >= T else (self.window - 1, 0)
    mask = None
    if segment_ids is not None:
      document = document_index(segment_ids)
      mask = (document[:, :, None] == document[:, None, :])[:, None]  # [B, 1, T, T]: t and s in one document
    o = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=self.head_dim**-0.5, is_causal=True,
                                     local_window_size=window,
                                     implementation=flash_implementation(q.dtype, self.head_dim))
    return self.o_proj(o.reshape(B, T, -1))

  def __call__(self, x, segment_ids=None, positions=None):
    """x: [B, T, width]; segment_ids, positions: None or [B, T] (positions default: 0 .. T - 1, or the position
    inside each document when packed)."""
    if positions is None:
      positions = jnp.arange(x.shape[1]) if segment_ids is None else document_positions(segment_ids)
    q, k, v, _ = self.project(x, positions, segment_ids)
    return self.attend(q, k, v, segment_ids)

  def init_cache(self, batch, max_len):
    L = max_len if self.window is None else min(self.window, max_len)
    shape = (batch, L, self.num_heads, self.head_dim)
    cache = {"k": jnp.zeros(shape, self.dtype), "v": jnp.zeros(shape, self.dtype)}
    if self.convs is not None:
      cache["conv"] = [conv.init_cache(batch) for conv in self.convs]
    return cache

  def prefill(self, x, max_len):
    """x: [B, T, width], T <= max_len -> (y [B, T, width], the cache of the last L tokens)."""
    B, T, _ = x.shape
    positions = jnp.arange(T)
    q, k, v, conv_cache = self.project(x, positions)
    cache = self.init_cache(B, max_len)
    kept = positions[max(T - cache["k"].shape[1], 0):]
    slots = kept % cache["k"].shape[1]
    cache.update(k=cache["k"].at[:, slots].set(k[:, kept]), v=cache["v"].at[:, slots].set(v[:, kept]))
    if conv_cache is not None:
      cache["conv"] = conv_cache
    return self.attend(q, k, v), cache

  def step(self, x_t, cache, position):
    """x_t: [B, width] at sequence index position (an int32 scalar, < max_len) -> (y_t [B, width], cache)."""
    L = cache["k"].shape[1]
    position = jnp.asarray(position, jnp.int32)
    q, k, v, conv_cache = self.project(x_t[:, None], position[None], conv_cache=cache.get("conv"))
    slot = position % L
    cache = {**cache, "k": jax.lax.dynamic_update_slice_in_dim(cache["k"], k.astype(self.dtype), slot, axis=1),
             "v": jax.lax.dynamic_update_slice_in_dim(cache["v"], v.astype(self.dtype), slot, axis=1)}
    if conv_cache is not None:
      cache["conv"] = conv_cache
    # Slot j holds the newest position <= position congruent to j mod L; negative means not yet written. The ring
    # keeps only the last L <= window positions, so the unwritten slots are all that is hidden.
    slot_positions = position - (position - jnp.arange(L)) % L
    # One query: its [B, H, 1, L] score row is small, and the xla path takes the explicit mask.
    o = jax.nn.dot_product_attention(q, cache["k"], cache["v"], mask=(slot_positions >= 0)[None, None, None],
                                     scale=self.head_dim**-0.5, implementation="xla")
    return self.o_proj(o.reshape(x_t.shape[0], -1)), cache
