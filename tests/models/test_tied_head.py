"""model.tie_embeddings: the head is the token embedding, in the logits, the loss and its gradient."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from sdm_jax.models import LanguageModel, count_params, default_config
from sdm_jax.models.loss import loss_fn


def test_tied_head_is_the_embedding():
  config = default_config()
  config.vocab_size, config.num_layers, config.pattern = 48, 1, "A"  # attention: the quickest to compile
  untied = nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0)))
  config.tie_embeddings = True
  model = LanguageModel(config, rngs=nnx.Rngs(0))
  assert count_params(untied) - count_params(model) == 48 * config.width
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 48, (2, 8)), jnp.int32)
  logits, features = nnx.jit(lambda m, t: (m(t), m.features(t)))(model, tokens)
  np.testing.assert_allclose(logits, features @ model.embed.embedding[...].T, rtol=1e-5, atol=1e-5)
  batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1), "mask": jnp.ones((2, 8), jnp.float32)}
  grads = nnx.jit(nnx.grad(lambda m: loss_fn(m, batch)[0]))(model)
  # The embedding's gradient is the lookup's plus the head's: every row gets the softmax's share.
  assert float(jnp.min(jnp.abs(grads["embed"]["embedding"][...]).sum(axis=1))) > 0
  assert model.head.out_features == 48  # what decoding reads
