"""The language model on packed documents (DESIGN.md section 9): a batch with "segment_ids" and "positions" gives every
document's tokens the loss they have alone, and the same parameter gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from model_helpers import small_config
from sdm_jax.models import LanguageModel
from sdm_jax.models.loss import loss_fn
from sdm_jax.testing.errors import relative_error

L, PAD = 11, 2  # two documents of L tokens, then PAD of padding: one row of T = 24 (chunk 16)
T = 2 * L + PAD


@nnx.jit
def loss_and_grads(model, batch):
  """The per-token loss of the logits and (mean masked loss, its parameter gradient) through loss_fn."""
  logits = model(batch["inputs"], batch.get("segment_ids"), batch.get("positions"))
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
  (loss, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch)
  return nll, loss, grads


def test_packed_batch_equals_documents_alone():
  # A delta rule (KDA) and sliding-window attention (window 6 < L); full attention is the layer test's. The scan
  # compiles fastest, and the op tests hold every impl to it when packed.
  model = LanguageModel(small_config("DS", "kda", impl="scan"), rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(0), (2, L + 1), 0, 64, jnp.int32)  # per document: inputs and targets
  alone = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "mask": jnp.ones((2, L), jnp.float32)}
  row = lambda x, pad: jnp.concatenate([x[0], x[1], jnp.full((PAD,), pad, x.dtype)])[None]
  packed = {"inputs": row(alone["inputs"], 5), "targets": row(alone["targets"], 5), "mask": row(alone["mask"], 0),
            "segment_ids": jnp.asarray([[1] * L + [2] * L + [0] * PAD], jnp.int32),
            "positions": jnp.asarray([list(range(L)) * 2 + [0] * PAD], jnp.int32)}
  nll, loss, grads = loss_and_grads(model, packed)
  nll_alone, loss_alone, grads_alone = loss_and_grads(model, alone)
  np.testing.assert_allclose(nll[0, :2 * L], nll_alone.reshape(-1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(loss, loss_alone, rtol=1e-6)
  for (path, g), g_alone in zip(jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(grads)),
                                jax.tree.leaves(nnx.to_pure_dict(grads_alone))):
    err = relative_error(g, g_alone)
    assert err < 1e-4, (jax.tree_util.keystr(path), err)
