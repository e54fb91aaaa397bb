"""The pre-norm residual block every model layer is: x + mixer(norm(x)), then x + mlp(norm(x))."""

import jax.numpy as jnp
from flax import nnx

from sdm_jax.layers.mlp import SwiGLU
from sdm_jax.layers.norm import RMSNorm


class Block(nnx.Module):
  """Wraps any token mixer (x: [B, T, width] -> [B, T, width]) with RMSNorms, residuals and a SwiGLU MLP.

  prefill and step pass the mixer's decoding cache through (see the mixers' init_cache). mlp_init: the MLP's
  weight initialiser.
  """

  def __init__(self, mixer, width, *, mlp_hidden, norm_eps=1e-6, mlp_init=nnx.initializers.lecun_normal(),
               dtype=jnp.float32, rngs):
    self.mixer_norm = RMSNorm(width, eps=norm_eps)
    self.mixer = mixer
    self.mlp_norm = RMSNorm(width, eps=norm_eps)
    self.mlp = SwiGLU(width, mlp_hidden, kernel_init=mlp_init, dtype=dtype, rngs=rngs)

  def __call__(self, x, segment_ids=None, positions=None):
    """x: [B, T, width]; segment_ids, positions: None or [B, T] for packed documents (the mixer's arguments)."""
    return self.feed_forward(x + self.mixer(self.mixer_norm(x), segment_ids=segment_ids, positions=positions))

  def prefill(self, x, max_len):
    """x: [B, T, width] -> (y, the mixer's cache)."""
    mixed, cache = self.mixer.prefill(self.mixer_norm(x), max_len)
    return self.feed_forward(x + mixed), cache

  def step(self, x_t, cache, position):
    """x_t: [B, width] at sequence index position -> (y_t, cache)."""
    mixed, cache = self.mixer.step(self.mixer_norm(x_t), cache, position)
    return self.feed_forward(x_t + mixed), cache

  def feed_forward(self, x):
    return x + self.mlp(self.mlp_norm(x))
