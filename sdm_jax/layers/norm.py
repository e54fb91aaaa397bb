"""RMSNorm over the last axis, computed in fp32 whatever the activation dtype."""

import jax
import jax.numpy as jnp
from flax import nnx


class RMSNorm(nnx.Module):
  """x / rms(x) * scale over the last axis (`features` wide); returns the input dtype.

  Applied to [B, T, H, V] it is the per-head norm of the mixers' readings (one scale shared by the heads).
  """

  def __init__(self, features, *, eps=1e-6):
    self.scale = nnx.Param(jnp.ones((features,), jnp.float32))
    self.eps = eps

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * self.scale[...]).astype(x.dtype)
