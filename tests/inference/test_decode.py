"""Recurrent decoding: prefill of a prompt then one step per token gives the logits of the full forward
over the whole sequence (every dense mixer, attention full and windowed, SDM), and generate is greedy
decoding by repeated full forwards, compiled once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdm_jax.models import LanguageModel, default_config
from sdm_jax.models import generate
from sdm_jax.ops import MIXERS

B, T, VOCAB = 2, 40, 64


def small_config(pattern, mixer="gdn2", attention_conv=0):
  c = default_config()
  # chunk_size 16 with a 20-token prompt puts the prefill's end inside a chunk; window 6 < T wraps the ring.
  c.update(vocab_size=VOCAB, width=32, num_heads=2, head_dim=16, value_dim=MIXERS[mixer].value_dim(16, 8),
           mixer=mixer, pattern=pattern, num_layers=len(pattern), chunk_size=16, window=6,
           attention_conv=attention_conv,
           sdm=dict(num_slots=64, topk_write=4, topk_read=3, key_dim=8, value_dim=8, chunk_size=8))
  return c


def tokens(seed, length=T):
  return jax.random.randint(jax.random.key(seed), (B, length), 0, VOCAB, jnp.int32)


@nnx.jit(static_argnames="prompt_len")
def decode_logits(model, tokens, prompt_len):
  """Prefills tokens[:, :prompt_len], then steps through the rest (teacher forcing): [B, T, vocab]."""
  prompt_logits, cache = model.prefill(tokens[:, :prompt_len], max_len=tokens.shape[1])

  def step(cache, inputs):
    token, position = inputs
    logits, cache = model.step(token, cache, position)
    return cache, logits

  positions = jnp.arange(prompt_len, tokens.shape[1])
  _, step_logits = jax.lax.scan(step, cache, (tokens[:, prompt_len:].T, positions))
  return jnp.concatenate([prompt_logits, jnp.moveaxis(step_logits, 0, 1)], axis=1)


CASES = [("D", mixer, 0) for mixer in MIXERS]
CASES += [(pattern, "gdn2", 0) for pattern in ("DS", "DDDA", "SSSM")]
CASES += [("SA", "gdn2", 3)]  # attention with its short convolutions: their cache carries over the prompt


@nnx.jit
def forward(model, tokens):
  return model(tokens)


@pytest.mark.parametrize("pattern, mixer, attention_conv", CASES)
def test_prefill_then_steps_match_the_full_forward(pattern, mixer, attention_conv):
  model = LanguageModel(small_config(pattern, mixer, attention_conv), rngs=nnx.Rngs(0))
  x = tokens(1)
  full = forward(model, x)
  for prompt_len in (20, 0):
    decoded = decode_logits(model, x, prompt_len)
    # Relative to the largest logit, since single logits near 0 have no meaningful relative error.
    np.testing.assert_allclose(decoded, full, rtol=0, atol=1e-4 * float(jnp.abs(full).max()),
                               err_msg=f"prompt_len {prompt_len}")


PROMPT_LEN, NEW = 9, 5


@pytest.fixture(scope="module")
def hybrid():
  return LanguageModel(small_config("DSAM"), rngs=nnx.Rngs(0))


def test_generate_is_greedy_decoding_and_compiles_once(hybrid):
  # A causal model's logits at t ignore what follows t, so one fixed-length forward serves every step.
  sequence = tokens(2, PROMPT_LEN + NEW)
  for t in range(PROMPT_LEN, PROMPT_LEN + NEW):
    next_token = jnp.argmax(forward(hybrid, sequence)[:, t - 1], axis=-1).astype(jnp.int32)
    sequence = sequence.at[:, t].set(next_token)
  prompt = sequence[:, :PROMPT_LEN]
  before = generate._generate._cache_size()
  generated = hybrid.generate(prompt, NEW, temperature=0.0)
  np.testing.assert_array_equal(generated, sequence[:, PROMPT_LEN:])
  np.testing.assert_array_equal(hybrid.generate(prompt, NEW, temperature=0.0, top_k=3, seed=3), generated)
  assert generate._generate._cache_size() == before + 1


def test_sampling_keeps_to_the_top_k(hybrid):
  prompt = tokens(3, PROMPT_LEN)
  samples = [hybrid.generate(prompt, NEW, temperature=1.0, top_k=2, seed=seed) for seed in range(3)]
  assert any(bool(jnp.any(samples[0] != s)) for s in samples[1:])
  logits = forward(hybrid, jnp.concatenate([prompt, samples[0]], axis=1))[:, PROMPT_LEN - 1:-1]
  top2 = jax.lax.top_k(logits, 2)[1]
  assert bool(jnp.all(jnp.any(top2 == samples[0][..., None], axis=-1)))


def test_bf16_model_decodes_like_its_full_forward():
  """bf16 compute: the recurrent step path agrees with the chunked full forward to bf16 precision
  (the states stay fp32 in both)."""
  config = small_config("DSAM")
  config.dtype = "bfloat16"
  model = LanguageModel(config, rngs=nnx.Rngs(0))
  x = tokens(2)
  full = forward(model, x).astype(jnp.float32)
  decoded = decode_logits(model, x, 20).astype(jnp.float32)
  assert decoded.dtype == full.dtype and bool(jnp.all(jnp.isfinite(decoded)))
  scale = float(jnp.abs(full).max())
  err = float(jnp.abs(decoded - full).max())
  print(f"bf16 decode vs full forward: max abs err {err:.3e} (max |logit| {scale:.3e})")
  np.testing.assert_allclose(decoded, full, rtol=0, atol=2e-2 * scale)
