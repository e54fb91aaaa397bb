"""One layer for every dense delta-rule mixer of the registry `ops.MIXERS` (DESIGN.md sections 1 and 4).

    q, k, v = SiLU(CausalConv(W x)),  g = LogDecay(x),  gates = sigmoid(W x)
    o = o_proj(RMSNorm(op(q, k, v, g, **gates)) * output_gate(W x))

with q and k L2-normalised inside the op. Which op runs, and how, is the op's business: the layer
passes `impl` (default "auto": the op picks) and `chunk_size` through, and its parameters do not depend on them.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from sdm_jax import ops
from sdm_jax.layers.conv import CausalConv
from sdm_jax.layers.decay import LogDecay
from sdm_jax.layers.norm import RMSNorm
from sdm_jax.layers.recurrent import RecurrentMixer

# The channel-wise decays' f is low-rank, width -> 128 -> H * K (the KDA and FG2-GDN papers).
DECAY_RANK = 128


@dataclasses.dataclass(frozen=True)
class OutputGate:
  """The layer's output gate, activation(f(x)): f a full Linear(width -> H * V), or with a rank,
  width -> rank -> H * V plus a bias."""
  activation: str  # "silu" or "sigmoid"
  rank: str | None = None  # None or "value": rank V


# The papers' output gates (DESIGN.md section 4); KDA's is Kimi Linear's low-rank gate, rank the head's value width,
# as fla's KDA layer builds it. Op, decay and gates come from the registry (`ops.MIXERS`); a registered mixer
# not listed here gets DEFAULT_OUTPUT_GATE.
OUTPUT_GATES = {
    "gdn": OutputGate("silu"),
    "kda": OutputGate("sigmoid", rank="value"),
    "fg2_gdn": OutputGate("sigmoid"),
    "fg2_gdn_plus": OutputGate("sigmoid"),
    "gdn2": OutputGate("silu"),
}
DEFAULT_OUTPUT_GATE = OutputGate("sigmoid")
ACTIVATIONS = {"silu": jax.nn.silu, "sigmoid": jax.nn.sigmoid}


class DeltaMixer(RecurrentMixer):
  """A dense delta-rule token mixer: `mixer` is a name in `ops.MIXERS` (gdn, kda, fg2_gdn, fg2_gdn_plus, gdn2).

  x: [B, T, width] -> [B, T, width]; H = num_heads, K = head_dim (keys), V = value_dim (values per head).
  """

  def __init__(self, width, *, mixer, num_heads, head_dim, value_dim, impl="auto", chunk_size=64,
               conv_size=4, dtype=jnp.float32, rngs):
    if mixer not in ops.MIXERS:
      raise ValueError(f"mixer: expected one of {tuple(ops.MIXERS)}, got {mixer!r}")
    variant, out_gate = ops.MIXERS[mixer], OUTPUT_GATES.get(mixer, DEFAULT_OUTPUT_GATE)
    variant.check_dims("value_dim", head_dim, value_dim)
    H, K, V = num_heads, head_dim, value_dim
    size = {"head": 1, "key": K, "value": V}
    linear = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, dtype=dtype, rngs=rngs)
    self.q_proj, self.k_proj, self.v_proj = linear(width, H * K), linear(width, H * K), linear(width, H * V)
    self.q_conv = CausalConv(H * K, kernel_size=conv_size, dtype=dtype, rngs=rngs)
    self.k_conv = CausalConv(H * K, kernel_size=conv_size, dtype=dtype, rngs=rngs)
    self.v_conv = CausalConv(H * V, kernel_size=conv_size, dtype=dtype, rngs=rngs)
    channel_wise = variant.decay == "key"
    self.decay = LogDecay(width, H, size[variant.decay], low_rank=DECAY_RANK if channel_wise else None,
                          dtype=dtype, rngs=rngs)
    for name, shape in variant.gates:
      setattr(self, f"{name}_proj", linear(width, H * size[shape]))
    self.o_norm = RMSNorm(V)
    if out_gate.rank is None:
      self.out_gate_proj = linear(width, H * V)
    else:
      self.out_gate_proj = nnx.Sequential(
          linear(width, size[out_gate.rank]),
          nnx.Linear(size[out_gate.rank], H * V, use_bias=True, dtype=dtype, rngs=rngs))
    self.o_proj = linear(H * V, width)
    self.mixer, self.variant, self.out_gate = mixer, variant, out_gate
    self.num_heads, self.head_dim, self.value_dim = H, K, V
    self.impl, self.chunk_size = impl, chunk_size

  def init_cache(self, batch, max_len=None):
    """The decoding cache: the three convs' histories and the fp32 recurrent state "S" [B, H, K, V].

    Its size does not grow with the sequence; max_len is accepted so every mixer has one signature.
    """
    del max_len
    return {"q_conv": self.q_conv.init_cache(batch), "k_conv": self.k_conv.init_cache(batch),
            "v_conv": self.v_conv.init_cache(batch),
            "S": jnp.zeros((batch, self.num_heads, self.head_dim, self.value_dim), jnp.float32)}

  def extend(self, x, cache, impl, segment_ids=None):
    """Runs x: [B, T, width] on from the state in cache; returns (y [B, T, width], the new cache).
    segment_ids: None or [B, T], packed documents: the convs and the op restart at every document (the cache
    then continues the row's first one)."""
    B, T, _ = x.shape
    heads = lambda y: y.reshape(B, T, self.num_heads, -1)
    new_cache = {}
    def conv(name, y):
      y, new_cache[f"{name}_conv"] = getattr(self, f"{name}_conv").extend(y, cache[f"{name}_conv"], segment_ids)
      return heads(jax.nn.silu(y))
    q, k, v = conv("q", self.q_proj(x)), conv("k", self.k_proj(x)), conv("v", self.v_proj(x))
    gates = {}
    for name, shape in self.variant.gates:
      gate = heads(jax.nn.sigmoid(getattr(self, f"{name}_proj")(x).astype(jnp.float32)))
      gates[name] = gate[..., 0] if shape == "head" else gate
    o, new_cache["S"] = self.variant.op(
        q, k, v, self.decay(x), **gates, use_qk_l2norm=True, impl=impl, chunk_size=self.chunk_size,
        initial_state=cache["S"], output_final_state=True, segment_ids=segment_ids)
    out_gate = ACTIVATIONS[self.out_gate.activation](heads(self.out_gate_proj(x)))
    return self.o_proj((self.o_norm(o) * out_gate).reshape(B, T, -1)), new_cache
