"""The data-dependent log decay of Mamba-2 / Gated DeltaNet, shared by every recurrent layer.

    g = -exp(A_log) * softplus(f(x) + dt_bias)  <= 0

A_log ~ log U(a_log_range) per head (U(1, 16) in KDA and GDN-2, U(0, 16) in GDN); dt_bias = softplus^-1(dt),
dt ~ logU(1e-3, 1e-1) floored at 1e-4, as every reference builds it, so that at f(x) = 0 the decay starts between
-16 * 0.1 and about 0 per token.

With a lower_bound (fla's safe gate, `KimiDeltaAttention(safe_gate=True, lower_bound=...)` in fla 0.6.0) the decay is
bounded instead:

    g = lower_bound * sigmoid(exp(A_log) * (f(x) + dt_bias))  in [lower_bound, 0]

and A_log starts at 0 (exp(A_log) = 1), as fla's safe-gate layer initialises it; dt_bias starts as above. In fp32
sigmoid never exceeds 1, so g never goes below lower_bound: the promise the ops' lower_bound takes (DESIGN.md
section 2).
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

A_RANGE = (1.0, 16.0)
DT_RANGE = (1e-3, 1e-1)
DT_FLOOR = 1e-4


def inverse_softplus(y):
  return y + jnp.log(-jnp.expm1(-y))


class LogDecay(nnx.Module):
  """The log decay per head (channels=1) or per key channel (channels=K).

  f is Linear(width -> H * channels) or, with low_rank, width -> low_rank -> H * channels, no biases; kernel_init
  initialises their weights. lower_bound: None (the softplus decay) or a number < 0 (the bounded safe-gate decay, whose
  A_log starts at 0 whatever a_log_range says). x: [B, T, width] -> g: [B, T, H] (channels=1) or [B, T, H, channels],
  fp32.
  """

  def __init__(self, width, num_heads, channels=1, *, low_rank=None, a_log_range=A_RANGE, lower_bound=None,
               kernel_init=nnx.initializers.lecun_normal(), dtype=jnp.float32, rngs):
    size = num_heads * channels
    linear = lambda n_in, n_out: nnx.Linear(n_in, n_out, use_bias=False, kernel_init=kernel_init, dtype=dtype,
                                            rngs=rngs)
    if low_rank is None:
      self.f_proj = linear(width, size)
    else:
      self.f_proj = nnx.Sequential(linear(width, low_rank), linear(low_rank, size))
    a_key = rngs.params()  # drawn either way, so that dt_bias is the same draw with and without the bound
    if lower_bound is None:
      self.A_log = nnx.Param(jnp.log(jax.random.uniform(a_key, (num_heads,), jnp.float32, *a_log_range)))
    else:
      self.A_log = nnx.Param(jnp.zeros((num_heads,), jnp.float32))
    log_dt = jax.random.uniform(rngs.params(), (size,), jnp.float32, *map(math.log, DT_RANGE))
    self.dt_bias = nnx.Param(inverse_softplus(jnp.maximum(jnp.exp(log_dt), DT_FLOOR)))
    self.num_heads, self.channels, self.lower_bound = num_heads, channels, lower_bound

  def __call__(self, x):
    B, T, _ = x.shape
    f = self.f_proj(x).astype(jnp.float32) + self.dt_bias[...]
    f = f.reshape(B, T, self.num_heads, self.channels)
    a = jnp.exp(self.A_log[...])[:, None]
    if self.lower_bound is None:
      g = -a * jax.nn.softplus(f)
    else:
      g = self.lower_bound * jax.nn.sigmoid(a * f)
    return g[..., 0] if self.channels == 1 else g
