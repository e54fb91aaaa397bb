"""Autoregressive generation: prefill the prompt, then one recurrent step per token inside one jitted scan."""

import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def check_arguments(prompt, max_new_tokens, *, temperature, top_k, vocab_size):
  """ValueError naming the argument unless prompt is int [B, T1 >= 1] of token ids in [0, vocab_size) (checked
  where prompt is concrete), max_new_tokens an int >= 0, temperature a number >= 0 and top_k None or an int in
  [1, vocab_size]."""
  shape, dtype = np.shape(prompt), getattr(prompt, "dtype", np.asarray(prompt).dtype)
  if len(shape) != 2 or not np.issubdtype(dtype, np.integer):
    raise ValueError(f"prompt: expected token ids, int [B, T1], got {dtype} {tuple(shape)}")
  if shape[1] == 0:
    raise ValueError("prompt: generate needs at least one token to condition on, got an empty prompt")
  if not isinstance(prompt, jax.core.Tracer) and np.size(prompt):
    low, high = int(np.min(prompt)), int(np.max(prompt))
    if low < 0 or high >= vocab_size:
      raise ValueError(f"prompt: token ids must lie in [0, {vocab_size}) (the vocabulary), got values in "
                       f"[{low}, {high}]")
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 0:
    raise ValueError(f"max_new_tokens: expected an integer >= 0, got {max_new_tokens!r}")
  if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature >= 0:
    raise ValueError(f"temperature: expected a number >= 0 (0 is greedy), got {temperature!r}")
  if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
                            or not 1 <= top_k <= vocab_size):
    raise ValueError(f"top_k: expected None (every token) or an integer in [1, {vocab_size}], got {top_k!r}")


def generate(model, prompt, max_new_tokens, *, temperature=0.0, top_k=None, seed=0):
  """prompt: [B, T1] int, T1 >= 1 -> the next max_new_tokens tokens [B, max_new_tokens] int32.

  model: a LanguageModel (anything with prefill, step and a head). temperature 0 is greedy (argmax);
  otherwise samples softmax(logits / temperature), from the top_k logits when top_k is set.
  Compiled once per (model structure, prompt shape, max_new_tokens): temperature, top_k, seed are traced.
  Bad arguments raise ValueError naming them (`check_arguments`).
  """
  vocab_size = model.head.out_features
  check_arguments(prompt, max_new_tokens, temperature=temperature, top_k=top_k, vocab_size=vocab_size)
  if max_new_tokens == 0:
    return jnp.zeros((np.shape(prompt)[0], 0), jnp.int32)
  graphdef, state = nnx.split(model)
  top_k = vocab_size if top_k is None else top_k
  return _generate(graphdef, state, jnp.asarray(prompt, jnp.int32), int(max_new_tokens), jnp.float32(temperature),
                   jnp.int32(top_k), jnp.uint32(seed))


def sample(logits, key, temperature, top_k):
  """logits: [B, vocab] -> tokens [B] int32 from the top_k logits; argmax where temperature is 0."""
  # A sort rather than lax.top_k, whose k must be static: changing top_k does not recompile.
  kth_largest = jnp.take(jnp.sort(logits, axis=-1), -top_k, axis=-1)[:, None]
  logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
  sampled = jax.random.categorical(key, logits / jnp.maximum(temperature, 1e-6))
  return jnp.where(temperature > 0, sampled, jnp.argmax(logits, axis=-1)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens"))
def _generate(graphdef, state, prompt, max_new_tokens, temperature, top_k, seed):
  model = nnx.merge(graphdef, state)
  T1 = prompt.shape[1]
  logits, cache = model.prefill(prompt, max_len=T1 + max_new_tokens)

  def decode(carry, inputs):
    logits, cache = carry
    position, key = inputs
    token = sample(logits, key, temperature, top_k)
    # The last iteration's step feeds a token no one reads: one wasted step keeps the loop uniform.
    return model.step(token, cache, position), token

  positions = T1 + jnp.arange(max_new_tokens)
  keys = jax.random.split(jax.random.key(seed), max_new_tokens)
  _, tokens = jax.lax.scan(decode, (logits[:, -1], cache), (positions, keys))
  return tokens.T
