"""The language model's configuration: every field, with defaults small enough for CPU tests."""

import ml_collections

from sdm_jax import ops

MIXERS = tuple(ops.MIXERS)  # every registered dense mixer is a pattern "D" variant of its own name
# (mixer for "D", pattern, layers): GDN-2 alternating with sliding-window attention, FG2-GDN
# 3 : 1 full attention, and 3 sliding-window attention : 1 Sparse Delta Memory.
HYBRIDS = {
    "gdn2_swa": ("gdn2", "DS", 2),
    "fg2_attn": ("fg2_gdn", "DDDA", 4),
    "sdm": ("gdn2", "SSSM", 4),
}
VARIANTS = MIXERS + tuple(HYBRIDS)


def default_config():
  """A ConfigDict with every field `LanguageModel` reads.

  head_dim / value_dim are per head (d_k, d_v); attention layers use head_dim for q, k and v.
  pattern letters: "D" dense delta mixer (`mixer`), "S" sliding-window attention (`window`),
  "A" full attention, "M" Sparse Delta Memory; the pattern is repeated or truncated to num_layers.
  impl / chunk_size select how the dense mixers run, sdm_impl / sdm_chunk_size how the SDM runs
  ("auto", the default: "pallas" on a GPU, else "chunk"; SDM "pallas": a Pallas kernel for the row work,
  chunk_size 16-64); none of them changes the parameters.
  remat: what each block saves for the backward ("none", "block", "dots", "dots_kernels"; `lm.REMAT_POLICIES`),
  which changes memory and speed, not results. sdm_rows_dtype ("float32", or "bfloat16": lossy, gradients
  within ~2e-3) and sdm_rows_segments (exact, replays the forward) shrink what the SDM's Pallas backward keeps;
  sdm_table_dtype "bfloat16" stores the SDM table in bf16 while its Pallas kernels run (lossy, faster);
  sdm_table_grad_dtype "bfloat16" the table's cotangent in its Pallas backward (lossy gradients, fewer bytes).
  sdm_address_impl: how the SDM finds its slots ("xla", or "pallas": the fused product-key kernel, the same slots).
  sdm_key_dim is the width of each sub-key (each half of an SDM query). tie_embeddings: the output head is the
  token embedding (no head parameters).
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
  c.chunk_size = 64
  c.window = 64
  c.mlp_ratio = 4.0
  c.sdm_heads = 2
  c.sdm_num_slots = 256
  c.sdm_topk_write = 8
  c.sdm_topk_read = 8
  c.sdm_value_dim = 32
  c.sdm_key_dim = 16
  c.sdm_impl = "auto"
  c.sdm_chunk_size = 16
  c.sdm_rows_dtype = "float32"
  c.sdm_rows_segments = 1
  c.sdm_table_dtype = "float32"
  c.sdm_table_grad_dtype = "float32"
  c.sdm_address_impl = "xla"
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
  model.impl = model.sdm_impl = "auto"
  if variant in MIXERS:
    model.mixer, model.pattern = variant, "D"
  else:
    model.mixer, model.pattern, model.num_layers = HYBRIDS[variant]
  return model
