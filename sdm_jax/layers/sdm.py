"""The Sparse Delta Memory layer (DESIGN.md section 3): a delta rule on a product-key-addressed table.

Per head, slot a * n + b (n = sqrt(N)) has the key (c1[a], c2[b]) from two learned sub-key tables;
a query (its halves from a projection) scores s1[a] + s2[b]. The write query selects the top W
slots, the read query the top R (`product_key_topk`), each weighted by a softmax over its selected
scores. Values v = Wv x; g = -exp(A_log) softplus(a_proj x + dt_bias) (`LogDecay`, a_proj its f_proj);
beta = sigmoid(b_proj x); readings are RMS-normalised per head, gated by sigmoid(Wog x), then projected by Wo.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from sdm_jax import ops
from sdm_jax.layers.decay import LogDecay
from sdm_jax.layers.norm import RMSNorm
from sdm_jax.layers.recurrent import RecurrentMixer
from sdm_jax.ops.implementations import configure
from sdm_jax.ops.sparse_delta import IMPLEMENTATIONS

# The learned initial table starts near zero so that early reads are mostly what was written.
M0_STDDEV = 1e-2


class SparseDeltaMemory(RecurrentMixer):
  """x: [B, T, width] -> [B, T, width].

  H = num_heads, N = num_slots (a perfect square), W = topk_write, R = topk_read slots per token,
  key_dim = the width of each sub-key (and of each query half), V = value_dim per head. impl and options: how the
  recurrence runs, `ops.sparse_delta_rule`'s impl and keyword options as it takes them (chunk_size; impl="pallas"'s
  rows_dtype and rows_segments, what it keeps for its backward, table_dtype, what it stores the table in,
  table_grad_dtype, what its backward stores the table's cotangent in, launch), checked here (ValueError naming
  one); they do not change the parameters. address_impl: how the slots are found (`ops.product_key_address`:
  "xla", the default, or "pallas", its fused kernel, slower on the H200 so far).
  """

  def __init__(self, width, *, num_heads, num_slots, topk_write, topk_read, key_dim, value_dim, impl="auto",
               address_impl="xla", dtype=jnp.float32, rngs, **options):
    n = math.isqrt(num_slots)
    if n * n != num_slots:
      raise ValueError(f"num_slots: product keys need a perfect square, got {num_slots}")
    for name, k in (("topk_write", topk_write), ("topk_read", topk_read)):
      if not 1 <= k <= num_slots:
        raise ValueError(f"{name}: expected 1 <= {name} <= num_slots = {num_slots}, got {k}")
    H, V = num_heads, value_dim
    linear = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, dtype=dtype, rngs=rngs)
    self.write_query_proj = linear(width, H * 2 * key_dim)
    self.read_query_proj = linear(width, H * 2 * key_dim)
    self.sub_keys_1 = nnx.Param(jax.random.normal(rngs.params(), (H, n, key_dim), jnp.float32))
    self.sub_keys_2 = nnx.Param(jax.random.normal(rngs.params(), (H, n, key_dim), jnp.float32))
    self.m0 = nnx.Param(M0_STDDEV * jax.random.normal(rngs.params(), (H, num_slots, V), jnp.float32))
    self.v_proj = linear(width, H * V)
    self.decay = LogDecay(width, H, dtype=dtype, rngs=rngs)
    self.b_proj = linear(width, H)
    self.o_norm = RMSNorm(V)
    self.out_gate_proj = linear(width, H * V)
    self.o_proj = linear(H * V, width)
    self.num_heads, self.key_dim, self.value_dim = H, key_dim, V
    self.topk_write, self.topk_read = topk_write, topk_read
    configure(impl, IMPLEMENTATIONS, options)  # the op's check of the impl and the options, here once at build
    # (name, value) pairs: a module's static attributes are hashed with its graph definition.
    self.impl, self.options, self.address_impl = impl, tuple(options.items()), address_impl

  def address(self, query, k):
    """query: [B, T, H * 2 * key_dim] -> (slot indices, softmax weights), both [B, T, H, k]."""
    B, T, _ = query.shape
    halves = query.astype(jnp.float32).reshape(B, T, self.num_heads, 2, self.key_dim) * self.key_dim**-0.5
    return ops.product_key_address(halves[..., 0, :], halves[..., 1, :], self.sub_keys_1[...], self.sub_keys_2[...],
                                   k, impl=self.address_impl)

  def init_cache(self, batch, max_len=None):
    """The decoding cache: the fp32 table "M" [B, H, N, V], starting from the learned m0.

    Its size does not grow with the sequence; max_len is accepted so every mixer has one signature.
    """
    del max_len
    return {"M": jnp.broadcast_to(self.m0[...], (batch, *self.m0.shape))}

  def extend(self, x, cache, impl, segment_ids=None):
    """Runs x: [B, T, width] on from the table in cache; returns (y [B, T, width], the new cache).
    segment_ids: None or [B, T], packed documents, passed to the op (`ops.sparse_delta_rule`)."""
    B, T, _ = x.shape
    heads = lambda y: y.reshape(B, T, self.num_heads, -1)
    k_idx, k_w = self.address(self.write_query_proj(x), self.topk_write)
    q_idx, q_w = self.address(self.read_query_proj(x), self.topk_read)
    v = heads(self.v_proj(x))
    beta = jax.nn.sigmoid(self.b_proj(x).astype(jnp.float32))
    # The options are the layer's impl's: a decoding step runs the scan (`RecurrentMixer.step`) without them.
    options = dict(self.options) if impl == self.impl else {}
    o, table = ops.sparse_delta_rule(cache["M"], k_idx, k_w, v, self.decay(x), beta, q_idx, q_w, impl=impl,
                                     output_final_state=True, **options,
                                     distinct_slots=True,  # product-key addressing picks k distinct slots
                                     # Only when packed: unpacked calls do not depend on the op taking it.
                                     **({} if segment_ids is None else {"segment_ids": segment_ids}))
    out_gate = jax.nn.sigmoid(heads(self.out_gate_proj(x)))
    return self.o_proj((self.o_norm(o) * out_gate).reshape(B, T, -1)), {"M": table}
