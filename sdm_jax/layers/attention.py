"""Causal softmax attention with rotary position embeddings, full or over a sliding window."""

import jax
import jax.numpy as jnp
from flax import nnx


def rotary(x, base=10000.0):
  """Rotates channel pairs (i, i + D/2) of x: [B, T, H, D] by angle t * base^(-2i/D) (RoPE, rotate-half form)."""
  T, D = x.shape[1], x.shape[-1]
  inv_freq = base ** (-jnp.arange(0, D // 2, dtype=jnp.float32) * 2 / D)
  angle = jnp.arange(T, dtype=jnp.float32)[:, None] * inv_freq  # [T, D/2]
  cos, sin = jnp.cos(angle)[:, None], jnp.sin(angle)[:, None]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
  """Multi-head causal attention; token t sees s in (t - window, t], or all s <= t when window is None.

  x: [B, T, width] -> [B, T, width]. Scores and softmax in fp32.
  """

  def __init__(self, width, *, num_heads, head_dim, window=None, rope_base=10000.0, dtype=jnp.float32, rngs):
    if head_dim % 2:
      raise ValueError(f"head_dim: RoPE rotates channel pairs, expected an even head_dim, got {head_dim}")
    if window is not None and window < 1:
      raise ValueError(f"window: expected a positive number of tokens or None, got {window}")
    linear = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, dtype=dtype, rngs=rngs)
    self.q_proj = linear(width, num_heads * head_dim)
    self.k_proj = linear(width, num_heads * head_dim)
    self.v_proj = linear(width, num_heads * head_dim)
    self.o_proj = linear(num_heads * head_dim, width)
    self.num_heads, self.head_dim, self.window, self.rope_base = num_heads, head_dim, window, rope_base

  def __call__(self, x):
    B, T, _ = x.shape
    heads = lambda y: y.reshape(B, T, self.num_heads, self.head_dim)
    q = rotary(heads(self.q_proj(x)), self.rope_base)
    k = rotary(heads(self.k_proj(x)), self.rope_base)
    v = heads(self.v_proj(x))
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * self.head_dim**-0.5
    t, s = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    visible = s <= t
    if self.window is not None:
      visible &= t - s < self.window
    # The diagonal is always visible, so no row is all -inf.
    weights = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1)
    o = jnp.einsum("bhts,bshd->bthd", weights.astype(v.dtype), v)
    return self.o_proj(o.reshape(B, T, -1))
