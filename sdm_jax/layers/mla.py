"""Multi-head Latent Attention (DeepSeek-V2): keys and values expanded from one low-rank latent per token, a decoupled
RoPE key shared by the heads, and a decode cache of the latent alone."""

import numbers

import jax
import jax.numpy as jnp
from flax import nnx

from sdm_jax.layers.attention import flash_implementation, rotary
from sdm_jax.layers.norm import RMSNorm
from sdm_jax.ops.segments import check_segment_ids, document_index, document_positions


def _check_positive(name, value, *, allow_none=False):
  if allow_none and value is None:
    return
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    expected = "a positive integer" + (" or None" if allow_none else "")
    raise ValueError(f"{name}: expected {expected}, got {value!r}")


class MultiHeadLatentAttention(nnx.Module):
  """Causal MLA; token t sees s in (t - window, t], or all s <= t when window is None.

  x: [B, T, width] -> [B, T, width]. Per token (DeepSeek-V2 section 2.1, names as fla's MLA layer):
    c_kv = RMSNorm(W_dkv x)                        the latent, [kv_lora_rank]      (kv_proj.layers[0], [1])
    [k_nope_h | v_h] = W_ukv c_kv per head h       [qk_nope_head_dim | v_head_dim] (kv_proj.layers[2])
    k_rope = RoPE(W_kr x), one for all heads       [qk_rope_head_dim]              (k_rope)
    [q_nope_h | q_rope_h] = W_q x, or W_uq RMSNorm(W_dq x) with q_lora_rank        (q_proj), q_rope_h rotated
    o_h = softmax((q_nope_h . k_nope_h + q_rope_h . k_rope) / sqrt(qk_nope_head_dim + qk_rope_head_dim)) v_h
    y = W_o [o_1 .. o_H]                                                           (o_proj)
  rope_base=None leaves q_rope and k_rope unrotated (NoPE: the decoupled key carries no position).

  Training materialises k and v per head and runs jax.nn.dot_product_attention on them (cuDNN's flash attention
  where `attention.flash_implementation` picks it); its q, k and v must share one head size, so the shorter of
  (qk_nope_head_dim + qk_rope_head_dim, v_head_dim) is zero-padded to the longer (zero channels add nothing to a
  score and the padded output channels are dropped). Packed documents (segment_ids [B, T], DESIGN.md section 9) as
  in `Attention`: a token sees only its own document, RoPE positions restart at every document unless given.

  Decoding caches what a token contributes before any head is formed, {"latent": [B, L, kv_lora_rank],
  "k_rope": [B, L, qk_rope_head_dim]} (the normed latent and the rotated shared key), L = min(window, max_len),
  position p in slot p % L as in `Attention`. A step absorbs W_ukv into the query and the output instead of
  expanding every cached latent: q_nope_h . (W_uk_h c) = (W_uk_h^T q_nope_h) . c and sum_s p_s W_uv_h c_s =
  W_uv_h (sum_s p_s c_s), which is the same attention exactly, in fp32.
  """

  def __init__(self, width, *, num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
               q_lora_rank=None, window=None, rope_base=10000.0, norm_eps=1e-5, dtype=jnp.float32, rngs):
    for name, value in (("width", width), ("num_heads", num_heads), ("kv_lora_rank", kv_lora_rank),
                        ("qk_nope_head_dim", qk_nope_head_dim), ("qk_rope_head_dim", qk_rope_head_dim),
                        ("v_head_dim", v_head_dim)):
      _check_positive(name, value)
    _check_positive("q_lora_rank", q_lora_rank, allow_none=True)
    _check_positive("window", window, allow_none=True)
    if qk_rope_head_dim % 2:
      raise ValueError(f"qk_rope_head_dim: RoPE rotates channel pairs, expected an even number, got {qk_rope_head_dim}")
    if rope_base is not None and not rope_base > 0:
      raise ValueError(f"rope_base: expected a positive number or None (no rotation), got {rope_base!r}")
    if not norm_eps > 0:
      raise ValueError(f"norm_eps: expected a positive number, got {norm_eps!r}")
    linear = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, dtype=dtype, rngs=rngs)
    # Low-rank projections are down, RMSNorm, up, in fla's nn.Sequential order, so that parameter paths map one to
    # one onto its checkpoints (q_proj.0.weight is q_proj/layers/0/kernel transposed). fla's RMSNorm eps is 1e-5.
    low_rank = lambda rank, n_out: nnx.Sequential(linear(width, rank), RMSNorm(rank, eps=norm_eps), linear(rank, n_out))
    qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
    if q_lora_rank is None:
      self.q_proj = linear(width, num_heads * qk_head_dim)
    else:
      self.q_proj = low_rank(q_lora_rank, num_heads * qk_head_dim)
    self.k_rope = linear(width, qk_rope_head_dim)
    self.kv_proj = low_rank(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim))
    self.o_proj = linear(num_heads * v_head_dim, width)
    self.width, self.num_heads, self.q_lora_rank, self.kv_lora_rank = width, num_heads, q_lora_rank, kv_lora_rank
    self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    self.qk_head_dim, self.window, self.rope_base, self.dtype = qk_head_dim, window, rope_base, dtype

  def rotate(self, x, positions):
    return x if self.rope_base is None else rotary(x, self.rope_base, positions)

  def queries(self, x, positions):
    """x: [B, T, width] -> q_nope [B, T, H, qk_nope_head_dim], q_rope (rotated) [B, T, H, qk_rope_head_dim]."""
    B, T, _ = x.shape
    q = self.q_proj(x).reshape(B, T, self.num_heads, self.qk_head_dim)
    return q[..., :self.qk_nope_head_dim], self.rotate(q[..., self.qk_nope_head_dim:], positions)

  def compress(self, x, positions):
    """x: [B, T, width] -> what the cache keeps of each token: latent [B, T, kv_lora_rank] (normed) and the shared
    key k_rope (rotated) [B, T, qk_rope_head_dim]."""
    down, norm, _ = self.kv_proj.layers
    return norm(down(x)), self.rotate(self.k_rope(x)[:, :, None], positions)[:, :, 0]

  def up_weights(self):
    """W_ukv split per head: (W_uk [kv_lora_rank, H, qk_nope_head_dim], W_uv [kv_lora_rank, H, v_head_dim])."""
    kernel = self.kv_proj.layers[2].kernel[...].reshape(self.kv_lora_rank, self.num_heads, -1)
    return kernel[..., :self.qk_nope_head_dim], kernel[..., self.qk_nope_head_dim:]

  def attend(self, q_nope, q_rope, latent, k_rope, segment_ids=None):
    """Training form over all T tokens at positions 0 .. T - 1 (queries' and compress's outputs) -> y [B, T, width];
    segment_ids: None or [B, T]."""
    B, T, H, _ = q_nope.shape
    kv = self.kv_proj.layers[2](latent).reshape(B, T, H, self.qk_nope_head_dim + self.v_head_dim)
    k_nope, v = kv[..., :self.qk_nope_head_dim], kv[..., self.qk_nope_head_dim:]
    q = jnp.concatenate([q_nope, q_rope], axis=-1)
    k = jnp.concatenate([k_nope, jnp.broadcast_to(k_rope[:, :, None], (B, T, H, self.qk_rope_head_dim))], axis=-1)
    D = max(self.qk_head_dim, self.v_head_dim)
    pad = lambda y: jnp.pad(y, ((0, 0), (0, 0), (0, 0), (0, D - y.shape[-1])))
    # As in Attention.attend: (left, right) = (window - 1, 0) is a window of `window` tokens; one covering the
    # sequence is plain causal attention.
    window = None if self.window is None or self.window >= T else (self.window - 1, 0)
    mask = None
    if segment_ids is not None:
      document = document_index(segment_ids)
      mask = (document[:, :, None] == document[:, None, :])[:, None]  # [B, 1, T, T]: t and s in one document
    o = jax.nn.dot_product_attention(pad(q), pad(k), pad(v), mask=mask, scale=self.qk_head_dim**-0.5, is_causal=True,
                                     local_window_size=window, implementation=flash_implementation(q.dtype, D))
    return self.o_proj(o[..., :self.v_head_dim].reshape(B, T, H * self.v_head_dim))

  def check_input(self, x):
    if x.ndim != 3 or x.shape[-1] != self.width:
      raise ValueError(f"x: expected shape [B, T, width] with width {self.width}, got {tuple(x.shape)}")

  def __call__(self, x, segment_ids=None, positions=None):
    """x: [B, T, width]; segment_ids, positions: None or [B, T] (positions default: 0 .. T - 1, or the position
    inside each document when packed)."""
    self.check_input(x)
    if segment_ids is not None:
      segment_ids = check_segment_ids(segment_ids, {"B": x.shape[0], "T": x.shape[1]})
    if positions is None:
      positions = jnp.arange(x.shape[1]) if segment_ids is None else document_positions(segment_ids)
    return self.attend(*self.queries(x, positions), *self.compress(x, positions), segment_ids)

  def init_cache(self, batch, max_len):
    L = max_len if self.window is None else min(self.window, max_len)
    return {"latent": jnp.zeros((batch, L, self.kv_lora_rank), self.dtype),
            "k_rope": jnp.zeros((batch, L, self.qk_rope_head_dim), self.dtype)}

  def prefill(self, x, max_len):
    """x: [B, T, width], T <= max_len -> (y [B, T, width], the cache of the last L tokens)."""
    self.check_input(x)
    B, T, _ = x.shape
    if T > max_len:
      raise ValueError(f"max_len: expected at least the prompt's {T} tokens, got {max_len}")
    positions = jnp.arange(T)
    latent, k_rope = self.compress(x, positions)
    cache = self.init_cache(B, max_len)
    L = cache["latent"].shape[1]
    kept = positions[max(T - L, 0):]
    cache = {"latent": cache["latent"].at[:, kept % L].set(latent[:, kept].astype(self.dtype)),
             "k_rope": cache["k_rope"].at[:, kept % L].set(k_rope[:, kept].astype(self.dtype))}
    return self.attend(*self.queries(x, positions), latent, k_rope), cache

  def step(self, x_t, cache, position):
    """x_t: [B, width] at sequence index position (an int32 scalar, < max_len) -> (y_t [B, width], cache)."""
    B = x_t.shape[0]
    L = cache["latent"].shape[1]
    position = jnp.asarray(position, jnp.int32)
    q_nope, q_rope = self.queries(x_t[:, None], position[None])
    latent, k_rope = self.compress(x_t[:, None], position[None])
    slot = position % L
    cache = {"latent": jax.lax.dynamic_update_slice_in_dim(cache["latent"], latent.astype(self.dtype), slot, axis=1),
             "k_rope": jax.lax.dynamic_update_slice_in_dim(cache["k_rope"], k_rope.astype(self.dtype), slot, axis=1)}
    # Slot j holds the newest position <= position congruent to j mod L; negative means not yet written (the ring
    # keeps only the last L <= window positions, so the unwritten slots are all that is hidden).
    slot_positions = position - (position - jnp.arange(L)) % L
    f32 = lambda y: y.astype(jnp.float32)
    w_uk, w_uv = (f32(w) for w in self.up_weights())
    q_latent = jnp.einsum("bhn,chn->bhc", f32(q_nope[:, 0]), w_uk)  # [B, H, kv_lora_rank]
    scores = (jnp.einsum("bhc,blc->bhl", q_latent, f32(cache["latent"]))
              + jnp.einsum("bhr,blr->bhl", f32(q_rope[:, 0]), f32(cache["k_rope"]))) * self.qk_head_dim**-0.5
    weights = jax.nn.softmax(jnp.where(slot_positions >= 0, scores, -jnp.inf), axis=-1)
    o_latent = jnp.einsum("bhl,blc->bhc", weights, f32(cache["latent"]))
    o = jnp.einsum("bhc,chv->bhv", o_latent, w_uv).astype(q_nope.dtype)
    return self.o_proj(o.reshape(B, self.num_heads * self.v_head_dim)), cache
