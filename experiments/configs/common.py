"""Pieces every experiment config shares: the model of a variant and the training defaults."""

from sdm_jax import ops
from sdm_jax.models.config import default_config as default_model_config
from sdm_jax.training.config import close_names, default_config as default_train_config

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
    check_variant(variant, VARIANTS)
  return model


def train_config(steps, learning_rate, *, warmup_steps=100, log_every=20, eval_every=200, checkpoint_every=200):
  return default_train_config(steps, learning_rate, warmup_steps=warmup_steps, log_every=log_every,
                              eval_every=eval_every, checkpoint_every=checkpoint_every)


def check_variant(variant, choices):
  """ValueError naming the config variant unless it is one of `choices`, with the close ones suggested."""
  if variant not in choices:
    raise ValueError(f"config variant: expected one of {tuple(choices)}, got {variant!r}"
                     f"{close_names(variant, choices)}")
