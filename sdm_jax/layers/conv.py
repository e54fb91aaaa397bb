"""The short causal depthwise convolution that the delta-rule layers put after the q, k, v projections."""

import jax.numpy as jnp
from flax import nnx

from sdm_jax.layers.init import torch_default
from sdm_jax.ops.segments import document_index


class CausalConv(nnx.Module):
  """y_t = sum_i kernel[i] * x_{t - (kernel_size - 1) + i} (+ bias), per channel, zero history before t = 0.

  x: [B, T, C] -> [B, T, C] in the compute dtype. For decoding, the cache is the last kernel_size - 1
  inputs, [B, kernel_size - 1, C]. With segment_ids [B, T] (packed documents, DESIGN.md section 9) a tap that
  reaches across a document start reads 0: each document sees zero history, as alone (the cache continues the
  row's first document).
  """

  def __init__(self, channels, *, kernel_size=4, use_bias=False, kernel_init=torch_default, dtype=jnp.float32, rngs):
    # Default: PyTorch's Conv1d init (fan_in = kernel_size for a depthwise conv), as in the papers' code.
    self.kernel = nnx.Param(kernel_init(rngs.params(), (kernel_size, channels), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((channels,), jnp.float32)) if use_bias else None
    self.channels, self.kernel_size = channels, kernel_size
    self.dtype = dtype

  def init_cache(self, batch):
    return jnp.zeros((batch, self.kernel_size - 1, self.channels), self.dtype)

  def __call__(self, x, segment_ids=None):
    return self.extend(x, self.init_cache(x.shape[0]), segment_ids)[0]

  def extend(self, x, cache, segment_ids=None):
    """Convolves x: [B, T, C] that follows the inputs in cache; returns (y [B, T, C], the new cache)."""
    B, T = x.shape[:2]
    history = jnp.concatenate([cache, x.astype(self.dtype)], axis=1)
    kernel = self.kernel[...].astype(self.dtype)
    taps = [history[:, i:i + T] for i in range(self.kernel_size)]
    if segment_ids is not None:
      # The cache's inputs count as the first document's (index 0); tap i reads token t - (kernel_size - 1 - i).
      document = document_index(segment_ids)
      history_document = jnp.concatenate([jnp.zeros((B, self.kernel_size - 1), jnp.int32), document], axis=1)
      taps = [jnp.where((history_document[:, i:i + T] == document)[..., None], tap, jnp.zeros((), tap.dtype))
              for i, tap in enumerate(taps)]
    y = sum(kernel[i] * tap for i, tap in enumerate(taps))
    if self.bias is not None:
      y = y + self.bias[...].astype(self.dtype)
    return y, history[:, history.shape[1] - (self.kernel_size - 1):]
