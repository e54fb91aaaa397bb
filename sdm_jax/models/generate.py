"""Autoregressive generation: prefill the prompt, then one recurrent step per token inside one jitted scan."""

import functools

import jax
import jax.numpy as jnp
from flax import nnx


def generate(model, prompt, max_new_tokens, *, temperature=0.0, top_k=None, seed=0):
  """prompt: [B, T1] int, T1 >= 1 -> the next max_new_tokens tokens [B, max_new_tokens] int32.

  model: a LanguageModel (anything with prefill, step and a head). temperature 0 is greedy (argmax);
  otherwise samples softmax(logits / temperature), from the top_k logits when top_k is set.
  Compiled once per (model structure, prompt shape, max_new_tokens): temperature, top_k, seed are traced.
  """
  if prompt.shape[1] == 0:
    raise ValueError("prompt: generate needs at least one token to condition on, got an empty prompt")
  graphdef, state = nnx.split(model)
  top_k = model.head.out_features if top_k is None else top_k
  return _generate(graphdef, state, jnp.asarray(prompt, jnp.int32), max_new_tokens, jnp.float32(temperature),
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
