"""The pre-norm residual block every model layer is: x + mixer(norm(x)), then x + mlp(norm(x))."""

import jax.numpy as jnp
from flax import nnx

from sdm_jax.layers.mlp import SwiGLU
from sdm_jax.layers.norm import RMSNorm


class Block(nnx.Module):
  """Wraps any token mixer (x: [B, T, width] -> [B, T, width]) with RMSNorms, residuals and a SwiGLU MLP."""

  def __init__(self, mixer, width, *, mlp_hidden, dtype=jnp.float32, rngs):
    self.mixer_norm = RMSNorm(width)
    self.mixer = mixer
    self.mlp_norm = RMSNorm(width)
    self.mlp = SwiGLU(width, mlp_hidden, dtype=dtype, rngs=rngs)

  def __call__(self, x):
    x = x + self.mixer(self.mixer_norm(x))
    return x + self.mlp(self.mlp_norm(x))
