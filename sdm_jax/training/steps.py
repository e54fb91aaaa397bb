"""The jitted train and eval steps: masked next-token cross-entropy and accuracy."""

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def masked_cross_entropy(logits, targets, mask):
  """logits [B, T, vocab]; targets [B, T] int; mask [B, T]. Returns (mean loss, metrics dict)."""
  logits = logits.astype(jnp.float32)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
  count = jnp.maximum(jnp.sum(mask), 1.0)
  loss = jnp.sum(nll * mask) / count
  correct = jnp.argmax(logits, -1) == targets
  accuracy = jnp.sum(correct * mask) / count
  # Exact match: a sequence counts only if every scored token is right (RULER's scoring).
  scored = jnp.any(mask > 0, axis=-1)
  sequences = jnp.sum(scored)
  exact = jnp.sum(jnp.all(correct | (mask == 0), axis=-1) & scored) / jnp.maximum(sequences, 1)
  return loss, {"loss": loss, "accuracy": accuracy, "exact_match": exact, "tokens": jnp.sum(mask),
                "sequences": sequences}


@nnx.jit
def train_step(model, optimizer, batch):
  def loss_fn(model):
    return masked_cross_entropy(model(batch["inputs"]), batch["targets"], batch["mask"])

  (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  optimizer.update(model, grads)
  return {**metrics, "grad_norm": optax.tree.norm(grads)}


@nnx.jit
def eval_step(model, batch):
  return masked_cross_entropy(model(batch["inputs"]), batch["targets"], batch["mask"])[1]
