"""generate's arguments: prompt ids outside the vocabulary, top_k < 1 or past the vocabulary, a negative
max_new_tokens and a negative temperature raise ValueError naming the argument (out-of-vocabulary ids used to
embed as silent zeros, top_k=0 to mean the whole vocabulary, a negative max_new_tokens to be blamed on max_len);
max_new_tokens=0 gives no tokens."""

import jax.numpy as jnp
import pytest
from flax import nnx

from sdm_jax.models import LanguageModel, default_config
from sdm_jax.models.generate import check_arguments

VOCAB = 64


@pytest.mark.parametrize("prompt, options, message", [
    ([[1, 64]], {}, r"^prompt: token ids must lie in \[0, 64\) \(the vocabulary\), got values in \[1, 64\]"),
    ([[-1, 2]], {}, r"^prompt: .*got values in \[-1, 2\]"),
    ([[1.0, 2.0]], {}, r"^prompt: expected token ids, int \[B, T1\]"),
    ([[1, 2]], {"top_k": 0}, r"^top_k: expected None \(every token\) or an integer in \[1, 64\], got 0"),
    ([[1, 2]], {"top_k": 65}, r"^top_k: "),
    ([[1, 2]], {"max_new_tokens": -1}, r"^max_new_tokens: expected an integer >= 0, got -1"),
    ([[1, 2]], {"temperature": -0.5}, r"^temperature: "),
])
def test_bad_arguments_name_themselves(prompt, options, message):
  arguments = {"max_new_tokens": 4, "temperature": 0.0, "top_k": None, **options}
  max_new_tokens = arguments.pop("max_new_tokens")
  with pytest.raises(ValueError, match=message):
    check_arguments(jnp.asarray(prompt), max_new_tokens, vocab_size=VOCAB, **arguments)


def test_generate_checks_its_arguments_and_zero_new_tokens_is_empty():
  config = default_config()
  config.update(vocab_size=VOCAB, width=32, num_layers=1, pattern="A", num_heads=2, head_dim=16)
  model = LanguageModel(config, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="^max_new_tokens: "):
    model.generate(jnp.ones((1, 3), jnp.int32), -2)
  assert model.generate(jnp.ones((2, 3), jnp.int32), 0).shape == (2, 0)
