"""The SwiGLU feed-forward layer."""

import jax
import jax.numpy as jnp
from flax import nnx


class SwiGLU(nnx.Module):
  """down(silu(gate(x)) * up(x)).  x: [B, T, width] -> [B, T, width]."""

  def __init__(self, width, hidden, *, kernel_init=nnx.initializers.lecun_normal(), dtype=jnp.float32, rngs):
    linear = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, kernel_init=kernel_init, dtype=dtype,
                                            rngs=rngs)
    self.gate_proj = linear(width, hidden)
    self.up_proj = linear(width, hidden)
    self.down_proj = linear(hidden, width)

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))
