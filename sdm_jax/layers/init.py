"""Parameter initialisers of the reference codes, as flax initialisers (DESIGN.md section 4).

PyTorch stores a Linear's weight [out, in]; flax's kernel is [in, out], so fan_in is shape[0] here. A depthwise
causal conv's kernel is [kernel_size, channels]; PyTorch's fan_in for it is kernel_size.
"""

import math

import jax
import jax.numpy as jnp


def normal(std):
  """N(0, std^2): fla's `_init_weights` for every Linear, Conv1d and Embedding (std = initializer_range)."""
  return jax.nn.initializers.normal(std)


def torch_default(key, shape, dtype=jnp.float32):
  """PyTorch's default weight for a Linear (kaiming_uniform(a=sqrt 5)) and a depthwise Conv1d alike:
  U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = shape[0] (in for a kernel [in, out], kernel_size for [kernel_size, C])."""
  bound = 1 / math.sqrt(shape[0])
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def xavier(gain):
  """xavier_uniform with a gain: U(-a, a), a = gain sqrt(6 / (fan_in + fan_out)) (the GDN-2 code's, gain 2^-2.5)."""
  def init(key, shape, dtype=jnp.float32):
    bound = gain * math.sqrt(6 / (shape[0] + shape[1]))
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


# Linear weight initialisers by name; their biases start at zero in every reference.
LINEAR_INITS = {"normal": lambda std: normal(std), "torch": lambda std: torch_default,
                "xavier": lambda std: xavier(2**-2.5), "lecun": lambda std: jax.nn.initializers.lecun_normal()}
CONV_INITS = {"normal": lambda std: normal(std), "torch": lambda std: torch_default}


def linear_init(name, std=0.02):
  if name not in LINEAR_INITS:
    raise ValueError(f"linear_init: expected one of {tuple(LINEAR_INITS)}, got {name!r}")
  return LINEAR_INITS[name](std)


def conv_init(name, std=0.02):
  if name not in CONV_INITS:
    raise ValueError(f"conv_init: expected one of {tuple(CONV_INITS)}, got {name!r}")
  return CONV_INITS[name](std)
