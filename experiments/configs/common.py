"""Pieces every experiment config shares: the model of a variant and the training defaults."""

from sdm_jax.models.config import HYBRIDS, MIXERS, VARIANTS, variant_config
from sdm_jax.training.config import close_names, default_config as default_train_config

__all__ = ["HYBRIDS", "MIXERS", "VARIANTS", "check_variant", "model_config", "train_config"]


def model_config(variant, vocab_size, **sizes):
  """The model of `variant` (`models.config.variant_config`), a bad variant named as the config variant."""
  check_variant(variant, VARIANTS)
  return variant_config(variant, vocab_size, **sizes)


def train_config(steps, learning_rate, *, warmup_steps=100, log_every=20, eval_every=200, checkpoint_every=200):
  return default_train_config(steps, learning_rate, warmup_steps=warmup_steps, log_every=log_every,
                              eval_every=eval_every, checkpoint_every=checkpoint_every)


def check_variant(variant, choices):
  """ValueError naming the config variant unless it is one of `choices`, with the close ones suggested."""
  if variant not in choices:
    raise ValueError(f"config variant: expected one of {tuple(choices)}, got {variant!r}"
                     f"{close_names(variant, choices)}")
