"""The short causal depthwise convolution that the delta-rule layers put after the q, k, v projections."""

import jax
import jax.numpy as jnp
from flax import nnx


class CausalConv(nnx.Module):
  """y_t = sum_i kernel[i] * x_{t - (kernel_size - 1) + i}, per channel, zero history before t = 0.

  x: [B, T, C] -> [B, T, C] in the compute dtype. For decoding, the cache is the last kernel_size - 1
  inputs, [B, kernel_size - 1, C].
  """

  def __init__(self, channels, *, kernel_size=4, dtype=jnp.float32, rngs):
    # PyTorch's Conv1d default (fan_in = kernel_size for a depthwise conv), as in the papers' code.
    bound = kernel_size**-0.5
    self.kernel = nnx.Param(jax.random.uniform(rngs.params(), (kernel_size, channels), jnp.float32, -bound, bound))
    self.channels, self.kernel_size = channels, kernel_size
    self.dtype = dtype

  def init_cache(self, batch):
    return jnp.zeros((batch, self.kernel_size - 1, self.channels), self.dtype)

  def __call__(self, x):
    return self.extend(x, self.init_cache(x.shape[0]))[0]

  def extend(self, x, cache):
    """Convolves x: [B, T, C] that follows the inputs in cache; returns (y [B, T, C], the new cache)."""
    T = x.shape[1]
    history = jnp.concatenate([cache, x.astype(self.dtype)], axis=1)
    kernel = self.kernel[...].astype(self.dtype)
    y = sum(kernel[i] * history[:, i:i + T] for i in range(self.kernel_size))
    return y, history[:, history.shape[1] - (self.kernel_size - 1):]
