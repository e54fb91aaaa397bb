"""The short causal depthwise convolution that the delta-rule layers put after the q, k, v projections."""

import jax
import jax.numpy as jnp
from flax import nnx


class CausalConv(nnx.Module):
  """y_t = sum_i kernel[i] * x_{t - (kernel_size - 1) + i}, per channel, zero history before t = 0.

  x: [B, T, C] -> [B, T, C] in the compute dtype.
  """

  def __init__(self, channels, *, kernel_size=4, dtype=jnp.float32, rngs):
    # PyTorch's Conv1d default (fan_in = kernel_size for a depthwise conv), as in the papers' code.
    bound = kernel_size**-0.5
    self.kernel = nnx.Param(jax.random.uniform(rngs.params(), (kernel_size, channels), jnp.float32, -bound, bound))
    self.kernel_size = kernel_size
    self.dtype = dtype

  def __call__(self, x):
    T = x.shape[1]
    x = x.astype(self.dtype)
    kernel = self.kernel[...].astype(self.dtype)
    padded = jnp.pad(x, ((0, 0), (self.kernel_size - 1, 0), (0, 0)))
    return sum(kernel[i] * padded[:, i:i + T] for i in range(self.kernel_size))
