"""Pieces every experiment config shares: the model of a variant and the training defaults."""

import ml_collections

from sdm_jax import ops
from sdm_jax.models.config import default_config as default_model_config
from sdm_jax.models.loss import LOSS_CHUNK_TOKENS

MIXERS = tuple(ops.MIXERS)  # every registered dense mixer is a pattern "D" variant of its own name
# (mixer for "D", pattern, layers): GDN-2 alternating with sliding-window attention, FG2-GDN
# 3 : 1 full attention, and 3 sliding-window attention : 1 Sparse Delta Memory.
HYBRIDS = {
    "gdn2_swa": ("gdn2", "DS", 2),
    "fg2_attn": ("fg2_gdn", "DDDA", 4),
    "sdm": ("gdn2", "SSSM", 4),
}
VARIANTS = MIXERS + tuple(HYBRIDS)


def model_config(variant, vocab_size, *, num_layers=2, width=128, num_heads=2, head_dim=64):
  """The model of `variant` (a mixer name or a hybrid name), impl "auto" ("pallas" on a GPU, else "chunk")."""
  model = default_model_config()
  model.vocab_size = vocab_size
  model.num_layers, model.width, model.num_heads = num_layers, width, num_heads
  model.head_dim = model.value_dim = head_dim
  model.impl = model.sdm_impl = "auto"
  if variant in MIXERS:
    model.mixer, model.pattern = variant, "D"
  elif variant in HYBRIDS:
    model.mixer, model.pattern, model.num_layers = HYBRIDS[variant]
  else:
    raise ValueError(f"config variant: expected one of {VARIANTS}, got {variant!r}")
  return model


def train_config(steps, learning_rate, *, warmup_steps=100, log_every=20, eval_every=200, checkpoint_every=200):
  train = ml_collections.ConfigDict()
  train.steps = steps
  train.learning_rate = learning_rate
  train.warmup_steps = warmup_steps
  train.final_lr_fraction = 0.1
  train.b1, train.b2 = 0.9, 0.95
  train.weight_decay = 0.1
  train.grad_clip = 1.0
  train.log_every = log_every
  train.eval_every = eval_every
  train.eval_batches = 4
  train.checkpoint_every = checkpoint_every
  train.keep_checkpoints = 3
  train.fsdp = False
  train.loss_chunk_tokens = LOSS_CHUNK_TOKENS
  return train
