"""The language model's configuration: every field, with defaults small enough for CPU tests."""

import ml_collections

from sdm_jax import ops
from sdm_jax.layers.delta import layer_config, preset_name

MIXERS = tuple(ops.MIXERS)  # every registered dense mixer is a pattern "D" variant of its own name
# (mixer for "D", pattern, layers): GDN-2 alternating with sliding-window attention, FG2-GDN 3 : 1 Multi-head Latent
# Attention (the FG2-GDN paper's hybrid, as Kimi Linear's; pattern "DDDA" gives it full attention instead), and
# 3 sliding-window attention : 1 Sparse Delta Memory.
HYBRIDS = {
    "gdn2_swa": ("gdn2", "DS", 2),
    "fg2_attn": ("fg2_gdn", "DDDL", 4),
    "sdm": ("gdn2", "SSSM", 4),
}
VARIANTS = MIXERS + tuple(HYBRIDS)


def delta_layer_fields(preset="default"):
  """The dense layer's nested config (`layers.delta.DeltaLayerConfig`, DESIGN.md section 4): a preset ("default":
  the paper's own layer where its code is public, else fla's; "fla"; "official") and, each None unless set, the
  fields that change it (output_gate.activation / rank / bias, decay_rank, gate_bias, conv_size, conv_bias,
  norm_eps, linear_init, conv_init, init_std, lower_bound). Ranks are "full", "value" or an int written as a string.
  lower_bound: fla's safe gate, a decay bounded to [lower_bound, 0) that impl="pallas" runs bounded (per-channel
  decays only; at least -160 / C for its chunk size C: -5 at its default 32, fla's recommended bound)."""
  typed = lambda field_type: ml_collections.FieldReference(None, field_type=field_type)
  return ml_collections.ConfigDict({
      "preset": preset,
      "output_gate": {"activation": typed(str), "rank": typed(str), "bias": typed(bool)},
      "decay_rank": typed(str), "gate_bias": typed(bool), "conv_size": typed(int), "conv_bias": typed(bool),
      "norm_eps": typed(float), "linear_init": typed(str), "conv_init": typed(str), "init_std": typed(float),
      "lower_bound": typed(float)})


def delta_layer(config):
  """The `DeltaLayerConfig` a model config's dense layers are built with: config.delta's preset of config.mixer,
  with the fields config.delta sets; with fla's preset the output norm's eps is the model's norm_eps unless set, as
  in fla's models."""
  fields = config.get("delta") or {"preset": "default"}
  fields = fields.to_dict() if hasattr(fields, "to_dict") else dict(fields)
  preset = fields.pop("preset", "default")
  gate = {k: v for k, v in (fields.pop("output_gate", None) or {}).items() if v is not None}
  changes = {k: v for k, v in fields.items() if v is not None}
  rank = lambda r: int(r) if isinstance(r, str) and r.isdigit() else r
  if "rank" in gate:
    gate["rank"] = rank(gate["rank"])
  if "decay_rank" in changes:
    changes["decay_rank"] = rank(changes["decay_rank"])
  if gate:
    changes["output_gate"] = gate
  if "norm_eps" not in changes and preset_name(config.mixer, preset) == "fla":
    changes["norm_eps"] = float(config.get("norm_eps", 1e-6))  # fla's models give every layer the model's norm_eps
  return layer_config(config.mixer, preset, **changes)


def mla_fields(head_dim):
  """Multi-head Latent Attention's nested config (`layers.MultiHeadLatentAttention`) for heads of head_dim, in
  Kimi Linear's and DeepSeek-V2's proportions (a latent of 4 heads' width, 512 at heads of 128; a decoupled RoPE key
  of half a head; no low-rank query) and Kimi Linear's NoPE (rope_base None: the rope key carries no position)."""
  return ml_collections.ConfigDict({
      "kv_lora_rank": 4 * head_dim, "q_lora_rank": ml_collections.FieldReference(None, field_type=int),
      "qk_nope_head_dim": head_dim, "qk_rope_head_dim": head_dim // 2, "v_head_dim": head_dim,
      "rope_base": ml_collections.FieldReference(None, field_type=float)})


def sdm_fields():
  """Sparse Delta Memory's nested config: `layers.SparseDeltaMemory`'s arguments (DESIGN.md section 3), which the
  layer takes as they are. num_heads, num_slots (N, a square), topk_write / topk_read (W, R), key_dim (each sub-key's
  width), value_dim; impl ("auto": "pallas" on a GPU, else "chunk") and chunk_size (16-64, the chunk impl's); the
  Pallas form's options, which trade exactness for memory and speed: rows_dtype ("float32", or "bfloat16": lossy,
  gradients within ~2e-3), rows_segments (exact, replays the forward), table_dtype "bfloat16" (the table in bf16 while
  the kernels run), table_grad_dtype "bfloat16" (the table's cotangent); address_impl ("xla", or "pallas": the fused
  product-key kernel, the same slots)."""
  return ml_collections.ConfigDict({
      "num_heads": 2, "num_slots": 256, "topk_write": 8, "topk_read": 8, "value_dim": 32, "key_dim": 16,
      "impl": "auto", "chunk_size": 16, "rows_dtype": "float32", "rows_segments": 1, "table_dtype": "float32",
      "table_grad_dtype": "float32", "address_impl": "xla"})


def default_config():
  """A ConfigDict with every field `LanguageModel` reads.

  head_dim / value_dim are per head (d_k, d_v); attention layers use head_dim for q, k and v.
  pattern letters: "D" dense delta mixer (`mixer`), "S" sliding-window attention (`window`),
  "A" full attention, "M" Sparse Delta Memory, "L" Multi-head Latent Attention (`mla`); the pattern is repeated or
  truncated to num_layers (`layer_kinds.LAYERS`). attention_conv: 0, or the taps of a short causal convolution after
  the q, k, v projections of the "A" and "S" layers (`attention.Attention`'s conv_size).
  impl / chunk_size select how the dense mixers run ("auto", the default: "pallas" on a GPU, else "chunk"; chunk_size
  None: the impl's rule); they do not change the parameters.
  delta: the dense layer's nested config (`delta_layer_fields`): which reference layer, and changes to it.
  sdm: Sparse Delta Memory's nested config (`sdm_fields`), the layer's arguments; mla: Multi-head Latent
  Attention's (`mla_fields`).
  mlp_hidden: the SwiGLU's hidden width (None: round(mlp_ratio * width)); norm_eps: the blocks' and the final
  RMSNorm's; init: how the embedding, the MLPs and the head start ("fla": N(0, 0.02) as fla's models; "lecun":
  flax's defaults). The dense layers start as their preset says.
  remat: what each block saves for the backward ("none", "block", "dots", "dots_kernels"; `lm.REMAT_POLICIES`),
  which changes memory and speed, not results. tie_embeddings: the output head is the token embedding (no head
  parameters).
  """
  c = ml_collections.ConfigDict()
  c.vocab_size = 256
  c.num_layers = 2
  c.width = 64
  c.num_heads = 2
  c.head_dim = 32
  c.value_dim = 32
  c.mixer = "gdn2"
  c.pattern = "D"
  c.impl = "auto"
  c.chunk_size = ml_collections.FieldReference(None, field_type=int)
  c.delta = delta_layer_fields()
  c.window = 64
  c.attention_conv = 0
  c.mla = mla_fields(c.head_dim)
  c.mlp_ratio = 4.0
  c.mlp_hidden = ml_collections.FieldReference(None, field_type=int)
  c.norm_eps = 1e-6
  c.init = "fla"
  c.sdm = sdm_fields()
  c.dtype = "float32"
  c.remat = "none"
  c.tie_embeddings = False
  return c


def variant_config(variant, vocab_size, *, num_layers=2, width=128, num_heads=2, head_dim=64):
  """The model of `variant` (a mixer name or a hybrid name), impl "auto" ("pallas" on a GPU, else "chunk")."""
  if variant not in VARIANTS:
    raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
  model = default_config()
  model.vocab_size = vocab_size
  model.num_layers, model.width, model.num_heads = num_layers, width, num_heads
  model.head_dim = model.value_dim = head_dim
  model.mla = mla_fields(head_dim)
  model.impl = model.sdm.impl = "auto"
  if variant in MIXERS:
    model.mixer, model.pattern = variant, "D"
  else:
    model.mixer, model.pattern, model.num_layers = HYBRIDS[variant]
  return model
