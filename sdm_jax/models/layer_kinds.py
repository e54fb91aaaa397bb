"""The one list of layer kinds a model's pattern string names: `LAYERS`, iterated by the model, its costs, the sweep
summary's labels and the configs, so that a kind registered here is everywhere at once (README "Contributing:
adding a layer kind"; tests/models/test_layer_kinds.py fails when one is missing anywhere).

A kind is a pattern letter, a label for legends, a build (model config, dtype, rngs) -> the token mixer (x: [B, T,
width] -> [B, T, width], with prefill / step / init_cache), and its own forward FLOPs per token at a sequence length
(what 6 x parameters leaves out, `costs.mixer_flops_per_token`).
"""

import dataclasses
import math
from typing import Callable

from sdm_jax.layers import Attention, DeltaMixer, MultiHeadLatentAttention, SparseDeltaMemory
from sdm_jax.models.config import delta_layer
from sdm_jax.ops.delta_rule import chunk_size_of


@dataclasses.dataclass(frozen=True)
class LayerKind:
  """letter: its pattern letter; label: its name in legends (None: the model's dense mixer); build(config, dtype,
  rngs) -> the layer; flops(config, seq_len) -> its forward FLOPs per token; doc: what it is, in a few words."""
  letter: str
  label: str | None
  build: Callable
  flops: Callable
  doc: str


LAYERS: dict[str, LayerKind] = {}


def register(kind):
  """Adds `kind` to LAYERS and returns it; ValueError if its letter is taken or not one capital letter."""
  if len(kind.letter) != 1 or not kind.letter.isupper():
    raise ValueError(f"letter: expected one capital letter, got {kind.letter!r}")
  if kind.letter in LAYERS:
    raise ValueError(f"letter: a layer kind {kind.letter!r} is already registered")
  LAYERS[kind.letter] = kind
  return kind


def _delta(c, dtype, rngs):
  return DeltaMixer(c.width, mixer=c.mixer, num_heads=c.num_heads, head_dim=c.head_dim, value_dim=c.value_dim,
                    layer=delta_layer(c), impl=c.impl, chunk_size=c.get("chunk_size"), dtype=dtype, rngs=rngs)


def _delta_flops(c, seq_len):
  # The state work, 6 K V per head (read q S, predict k S, write k z^T), plus the chunk's grams 2 C (K + V) at the
  # chunk size C the op runs.
  C = chunk_size_of(c.impl, c.get("chunk_size"), seq_len)
  return c.num_heads * (6 * c.head_dim * c.value_dim + 2 * C * (c.head_dim + c.value_dim))


def _attention(window):
  def build(c, dtype, rngs):
    return Attention(c.width, num_heads=c.num_heads, head_dim=c.head_dim, window=c.window if window else None,
                     conv_size=c.get("attention_conv", 0), dtype=dtype, rngs=rngs)  # (configs saved before it)
  return build


def _attention_flops(window):
  # Scores and values, 4 D x the keys a token sees: half the sequence when causal, the window when shorter.
  def flops(c, seq_len):
    seen = min(c.window, seq_len / 2) if window else seq_len / 2
    return c.num_heads * 4 * c.head_dim * seen
  return flops


def _sdm(c, dtype, rngs):
  if "sdm" not in c:
    raise ValueError("model.sdm: expected Sparse Delta Memory's nested config (models.config.sdm_fields); this "
                     "config has none (a run saved with the earlier flat model.sdm_* fields)")
  return SparseDeltaMemory(c.width, **c.sdm, dtype=dtype, rngs=rngs)


def _sdm_flops(c, seq_len):
  # The rows, 2 V (3 W + R), and the sub-key scores, 4 sqrt(N) key_dim, per head.
  m = c.sdm
  return m.num_heads * (2 * m.value_dim * (3 * m.topk_write + m.topk_read) + 4 * math.isqrt(m.num_slots) * m.key_dim * 2)


def _mla(c, dtype, rngs):
  m = c.mla
  return MultiHeadLatentAttention(c.width, num_heads=c.num_heads, kv_lora_rank=m.kv_lora_rank,
                                  qk_nope_head_dim=m.qk_nope_head_dim, qk_rope_head_dim=m.qk_rope_head_dim,
                                  v_head_dim=m.v_head_dim, q_lora_rank=m.q_lora_rank, rope_base=m.rope_base,
                                  norm_eps=c.get("norm_eps", 1e-6), dtype=dtype, rngs=rngs)


def _mla_flops(c, seq_len):
  # Scores over (nope + rope) channels and values over v_head_dim, 2 x each per key seen (half the sequence).
  m = c.mla
  return c.num_heads * 2 * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * seq_len / 2


register(LayerKind("D", None, _delta, _delta_flops, "dense delta mixer (model.mixer, model.delta)"))
register(LayerKind("S", "swa", _attention(True), _attention_flops(True), "sliding-window attention (model.window)"))
register(LayerKind("A", "attention", _attention(False), _attention_flops(False), "full attention"))
register(LayerKind("M", "sdm", _sdm, _sdm_flops, "Sparse Delta Memory (model.sdm)"))
register(LayerKind("L", "mla", _mla, _mla_flops, "Multi-head Latent Attention (model.mla)"))
