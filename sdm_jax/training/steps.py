"""The train step: one jitted pure function of the model's and optimizer's arrays, which it donates, that
differentiates the model's chunked loss (sdm_jax.models.loss)."""

import functools

import jax
import optax
from flax import nnx

from sdm_jax.models.loss import LOSS_CHUNK_TOKENS, loss_fn


def _train_step(graphdef, chunk_tokens, state, batch):
  model, optimizer = nnx.merge(graphdef, state)
  (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch, chunk_tokens)
  optimizer.update(model, grads)
  return nnx.state((model, optimizer)), {**metrics, "grad_norm": optax.tree.norm(grads)}


@functools.lru_cache(maxsize=16)
def _jitted_train_step(graphdef, chunk_tokens):
  # One compilation per model structure: a TrainStep built again for the same model (a resumed run, a test)
  # finds it here.
  return jax.jit(functools.partial(_train_step, graphdef, chunk_tokens), donate_argnums=0)


class TrainStep:
  """step(batch) -> metrics (device scalars, not fetched): one optimizer step on the model and optimizer.

  The arrays of model and optimizer travel as one pytree through a jitted pure function that donates them
  (nnx.jit would traverse both module graphs on every call, and without donation the parameters and Adam
  moments would exist twice at the step's peak). Between steps the newest arrays are held here, not in the
  modules: call sync() before reading the model or optimizer (evaluation, checkpoints).
  """

  def __init__(self, model, optimizer, *, loss_chunk_tokens=LOSS_CHUNK_TOKENS):
    self.model, self.optimizer = model, optimizer
    graphdef, self.state = nnx.split((model, optimizer))
    self._step = _jitted_train_step(graphdef, loss_chunk_tokens)
    self._synced = True

  def __call__(self, batch):
    self.state, metrics = self._step(self.state, batch)
    self._synced = False
    return metrics

  def sync(self):
    """Writes the newest arrays into the model and optimizer (whose own arrays were donated)."""
    if not self._synced:
      nnx.update((self.model, self.optimizer), self.state)
      self._synced = True


def train_step(model, optimizer, batch, *, loss_chunk_tokens=LOSS_CHUNK_TOKENS):
  """One TrainStep call that leaves the result in model and optimizer (for one-off steps and tests)."""
  step = TrainStep(model, optimizer, loss_chunk_tokens=loss_chunk_tokens)
  metrics = step(batch)
  step.sync()
  return metrics
