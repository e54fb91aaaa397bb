"""One layer for every dense delta-rule mixer of the registry `ops.MIXERS` (DESIGN.md sections 1 and 4).

    q, k, v = SiLU(CausalConv(W x)),  g = LogDecay(x),  gates = sigmoid(W x)
    o = o_proj(RMSNorm(op(q, k, v, g, **gates)) * output_gate(x))

with q and k L2-normalised inside the op. What makes the layer one paper's layer (the output gate's activation,
rank and bias, the decay projection's rank, biases, convs, norm eps, initialisation) is a `DeltaLayerConfig`; the
reference layers are its `PRESETS`. Which op runs, and how, is the op's business: the layer passes `impl` (default
"auto": the op picks) and `chunk_size` (default None: the impl's rule) through, and its parameters do not depend on
them.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from sdm_jax import ops
from sdm_jax.layers import init
from sdm_jax.layers.conv import CausalConv
from sdm_jax.layers.decay import LogDecay
from sdm_jax.layers.norm import RMSNorm
from sdm_jax.layers.recurrent import RecurrentMixer
from sdm_jax.ops.delta_rule import check_bound

ACTIVATIONS = {"silu": jax.nn.silu, "sigmoid": jax.nn.sigmoid}


def _check_rank(name, rank):
  if not (rank in ("full", "value") or (isinstance(rank, int) and not isinstance(rank, bool) and rank > 0)):
    raise ValueError(f"{name}: expected 'full', 'value' (the head's value width) or a positive int, got {rank!r}")


@dataclasses.dataclass(frozen=True)
class OutputGate:
  """The output gate, activation(f(x)). f is Linear(width -> H * V) at rank "full", else width -> rank -> H * V
  ("value": rank V, Kimi Linear's low-rank gate); bias: a bias on f's last Linear."""
  activation: str
  rank: str | int = "full"
  bias: bool = False

  def __post_init__(self):
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"output_gate.activation: expected one of {tuple(ACTIVATIONS)}, got {self.activation!r}")
    _check_rank("output_gate.rank", self.rank)


@dataclasses.dataclass(frozen=True)
class DeltaLayerConfig:
  """Everything that tells one reference layer from another (DESIGN.md section 4).

  output_gate: `OutputGate`. decay_rank: the decay's f, "full" (Linear(width -> H * channels)), "value" (width -> V
  -> H * channels) or an int. gate_bias: a bias on the gate projections (beta, b, w). conv_size / conv_bias: the
  short convs of q, k, v. norm_eps: the output RMSNorm's. a_log_range: A ~ U(a_log_range) per head.
  linear_init: "normal" (N(0, init_std), fla's models), "torch" (PyTorch's default Linear), "xavier" (gain 2^-2.5,
  the GDN-2 code) or "lecun" (flax's default); every bias starts at 0. conv_init: "normal" or "torch".
  lower_bound: None, or fla's safe gate: the decay g = lower_bound * sigmoid(exp(A_log) (f(x) + dt_bias)) in
  [lower_bound, 0) with A_log starting at 0 (`LogDecay`), and the op told g >= lower_bound, so that impl="pallas" forms
  its grams bounded (DESIGN.md section 2); per-channel decays only, within the op's range at the layer's chunk size.
  """
  output_gate: OutputGate
  decay_rank: str | int = "value"
  gate_bias: bool = False
  conv_size: int = 4
  conv_bias: bool = False
  norm_eps: float = 1e-5
  a_log_range: tuple = (1.0, 16.0)
  linear_init: str = "normal"
  conv_init: str = "normal"
  init_std: float = 0.02
  lower_bound: float | None = None

  def __post_init__(self):
    if not isinstance(self.output_gate, OutputGate):
      raise ValueError(f"output_gate: expected an OutputGate, got {self.output_gate!r}")
    _check_rank("decay_rank", self.decay_rank)
    if not (isinstance(self.conv_size, int) and self.conv_size >= 1):
      raise ValueError(f"conv_size: expected an int >= 1, got {self.conv_size!r}")
    if not (isinstance(self.norm_eps, float) and self.norm_eps > 0):
      raise ValueError(f"norm_eps: expected a float > 0, got {self.norm_eps!r}")
    low, high = self.a_log_range
    if not 0 <= low < high:
      raise ValueError(f"a_log_range: expected (low, high) with 0 <= low < high, got {self.a_log_range!r}")
    init.linear_init(self.linear_init, self.init_std), init.conv_init(self.conv_init, self.init_std)

  def replace(self, **changes):
    """A copy with fields changed; output_gate may be a dict of OutputGate fields to change."""
    if isinstance(changes.get("output_gate"), dict):
      changes["output_gate"] = dataclasses.replace(self.output_gate, **changes["output_gate"])
    return dataclasses.replace(self, **changes)

  def to_dict(self):
    return dataclasses.asdict(self)


# fla 0.6.0's layers (`fla/layers/{gated_deltanet,kda,gdn2}.py`), with the initialisation of fla's models
# (`_init_weights`: N(0, 0.02) for every Linear and Conv1d, zero biases).
_FLA_CHANNEL_WISE = DeltaLayerConfig(OutputGate("sigmoid", "value", bias=True), decay_rank="value")
# The reference layers, by mixer and preset name. "official" is the paper's own code where it is public and differs
# from fla's: GDN, NVlabs/GatedDeltaNet (`lit_gpt/gated_delta_net.py`: a bias on beta's projection, A ~ U(0, 16),
# PyTorch's default init); KDA, Kimi Linear's HF `modeling_kimi.py` (no bias on the gate's up projection, convs
# at PyTorch's default); GDN-2, NVIDIA's `lit_gpt/gdn2.py` (SiLU gate, xavier gain 2^-2.5 on every Linear). FG2-GDN
# and FG2-GDN+ have no public code: KDA's fla layer with the channel-wise beta.
PRESETS = {
    "gdn": {"fla": DeltaLayerConfig(OutputGate("silu"), decay_rank="full", a_log_range=(0.0, 16.0)),
            "official": DeltaLayerConfig(OutputGate("silu"), decay_rank="full", gate_bias=True,
                                         a_log_range=(0.0, 16.0), linear_init="torch", conv_init="torch")},
    "kda": {"fla": _FLA_CHANNEL_WISE,
            "official": _FLA_CHANNEL_WISE.replace(output_gate={"bias": False}, conv_init="torch")},
    "fg2_gdn": {"fla": _FLA_CHANNEL_WISE},
    "fg2_gdn_plus": {"fla": _FLA_CHANNEL_WISE},
    "gdn2": {"fla": _FLA_CHANNEL_WISE,
             "official": _FLA_CHANNEL_WISE.replace(output_gate={"activation": "silu"}, linear_init="xavier",
                                                   conv_init="torch")},
}
# A mixer registered without presets gets fla's channel-wise layer.
DEFAULT_PRESETS = {"fla": _FLA_CHANNEL_WISE}


def presets(mixer):
  """{preset name: DeltaLayerConfig} of a registered mixer."""
  if mixer not in ops.MIXERS:
    raise ValueError(f"mixer: expected one of {tuple(ops.MIXERS)}, got {mixer!r}")
  return PRESETS.get(mixer, DEFAULT_PRESETS)


def preset_name(mixer, preset):
  """The preset that `preset` names for `mixer`: "default" is "official" where the mixer has one, else "fla"."""
  if preset == "default":
    return "official" if "official" in presets(mixer) else "fla"
  return preset


def layer_config(mixer, preset="default", **changes):
  """The DeltaLayerConfig of `mixer`'s preset with `changes` (DeltaLayerConfig fields; output_gate may be a dict).

  preset "default" is the paper's own layer where its code is public ("official"), else fla's.
  """
  available = presets(mixer)
  preset = preset_name(mixer, preset)
  if preset not in available:
    raise ValueError(f"preset: {mixer} has presets {('default', *available)}, got {preset!r}")
  fields = {f.name for f in dataclasses.fields(DeltaLayerConfig)}
  if unknown := set(changes) - fields:
    raise ValueError(f"layer config: unknown fields {sorted(unknown)}; expected some of {sorted(fields)}")
  return available[preset].replace(**changes)


def _rank(rank, value_dim):
  return {"full": None, "value": value_dim}.get(rank, rank)


class DeltaMixer(RecurrentMixer):
  """A dense delta-rule token mixer: `mixer` is a name in `ops.MIXERS` (gdn, kda, fg2_gdn, fg2_gdn_plus, gdn2).

  x: [B, T, width] -> [B, T, width]; H = num_heads, K = head_dim (keys), V = value_dim (values per head).
  layer: a DeltaLayerConfig (default: `layer_config(mixer)`, the paper's own layer).
  """

  def __init__(self, width, *, mixer, num_heads, head_dim, value_dim, layer=None, impl="auto", chunk_size=None,
               dtype=jnp.float32, rngs):
    layer = layer_config(mixer) if layer is None else layer
    if not isinstance(layer, DeltaLayerConfig):
      raise ValueError(f"layer: expected a DeltaLayerConfig, got {type(layer).__name__}")
    variant = ops.MIXERS[mixer]
    variant.check_dims("value_dim", head_dim, value_dim)
    try:
      check_bound(layer.lower_bound, chunk_size, scalar_decay=variant.decay == "head")
    except ValueError as e:
      raise ValueError(f"{mixer} layer's {e}") from None
    H, K, V = num_heads, head_dim, value_dim
    size = {"head": 1, "key": K, "value": V}
    kernel_init = init.linear_init(layer.linear_init, layer.init_std)
    linear = lambda n_in, n_out, bias=False: nnx.Linear(n_in, n_out, use_bias=bias, kernel_init=kernel_init,
                                                        dtype=dtype, rngs=rngs)
    self.q_proj, self.k_proj, self.v_proj = linear(width, H * K), linear(width, H * K), linear(width, H * V)
    conv = lambda channels: CausalConv(channels, kernel_size=layer.conv_size, use_bias=layer.conv_bias,
                                       kernel_init=init.conv_init(layer.conv_init, layer.init_std), dtype=dtype,
                                       rngs=rngs)
    self.q_conv, self.k_conv, self.v_conv = conv(H * K), conv(H * K), conv(H * V)
    self.decay = LogDecay(width, H, size[variant.decay], low_rank=_rank(layer.decay_rank, V),
                          a_log_range=layer.a_log_range, lower_bound=layer.lower_bound, kernel_init=kernel_init,
                          dtype=dtype, rngs=rngs)
    for name, shape in variant.gates:
      setattr(self, f"{name}_proj", linear(width, H * size[shape], layer.gate_bias))
    self.o_norm = RMSNorm(V, eps=layer.norm_eps)
    gate = layer.output_gate
    if (rank := _rank(gate.rank, V)) is None:
      self.out_gate_proj = linear(width, H * V, gate.bias)
    else:
      self.out_gate_proj = nnx.Sequential(linear(width, rank), linear(rank, H * V, gate.bias))
    self.o_proj = linear(H * V, width)
    self.mixer, self.variant, self.layer = mixer, variant, layer
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
        initial_state=cache["S"], output_final_state=True, segment_ids=segment_ids, lower_bound=self.layer.lower_bound)
    out_gate = ACTIVATIONS[self.layer.output_gate.activation](heads(self.out_gate_proj(x)))
    return self.o_proj((self.o_norm(o) * out_gate).reshape(B, T, -1)), new_cache
