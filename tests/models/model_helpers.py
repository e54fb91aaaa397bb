"""What the model tests share: a small language model config."""

from sdm_jax.models import default_config


def small_config(pattern, mixer="gdn2", **overrides):
  c = default_config()
  c.update(vocab_size=64, width=32, num_heads=2, head_dim=16, value_dim=8, mixer=mixer, pattern=pattern,
           num_layers=len(pattern), chunk_size=16, window=6,
           sdm=dict(num_slots=64, topk_write=4, topk_read=3, key_dim=8, value_dim=8, chunk_size=8))
  c.update(**overrides)
  return c
