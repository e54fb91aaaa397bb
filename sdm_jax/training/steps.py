"""The train step: one jitted pure function of the model's and optimizer's arrays, which it donates, that
differentiates the model's chunked loss (sdm_jax.models.loss), over the whole batch at once or accumulated over
microbatches."""

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sdm_jax.models.loss import LOSS_CHUNK_TOKENS, loss_fn


def microbatches(batch, steps):
  """batch {name: [B, ...]} -> {name: [steps, B / steps, ...]}: row r goes to microbatch r % steps, so a batch whose
  rows lie in contiguous blocks over the devices (the data-parallel mesh) gives every device an equal share of each
  microbatch."""
  def split(x):
    if x.shape[0] % steps:
      raise ValueError(f"gradient_accumulation_steps: the batch's {x.shape[0]} rows do not split into {steps} "
                       f"microbatches")
    return jnp.swapaxes(x.reshape(x.shape[0] // steps, steps, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def accumulated_gradients(model, batch, steps, chunk_tokens=LOSS_CHUNK_TOKENS):
  """The gradient of the whole batch's loss_fn and its metrics, from `steps` microbatches in a lax.scan: only one
  microbatch's activations exist at a time.

  batch: {"inputs", "targets", "mask" [B, T], optionally "segment_ids", "positions"}, B a multiple of steps.
  Returns (grads, a State of the model's Params in their dtype; metrics, those of loss_fn on the whole batch). Every
  microbatch's loss is normalised by the kept tokens (the mask's sum) of the whole batch, as loss_fn's is, so with
  packed rows, whose microbatches keep different numbers of tokens, the sum is still the whole batch's mean; the
  gradients are summed in fp32.
  """
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  kept = jnp.maximum(jnp.sum(batch["mask"]), 1.0)

  def microbatch_loss(params, microbatch):
    loss, metrics = loss_fn(nnx.merge(graphdef, params, rest), microbatch, chunk_tokens)
    # loss_fn's loss is the microbatch's mean over max(its kept tokens, 1); this weight turns it into the
    # microbatch's share of the whole batch's mean.
    return loss * (jnp.maximum(metrics["tokens"], 1.0) / kept), metrics

  def accumulate(carry, microbatch):
    grad_sum, sums = carry
    (_, metrics), grads = jax.value_and_grad(microbatch_loss, has_aux=True)(params, microbatch)
    grad_sum = jax.tree.map(lambda total, g: total + g.astype(jnp.float32), grad_sum, grads)
    tokens, sequences = jnp.maximum(metrics["tokens"], 1.0), jnp.maximum(metrics["sequences"], 1.0)
    sums = {"loss": sums["loss"] + metrics["loss"] * tokens,
            "accuracy": sums["accuracy"] + metrics["accuracy"] * tokens,
            "exact_match": sums["exact_match"] + metrics["exact_match"] * sequences,
            "tokens": sums["tokens"] + metrics["tokens"], "sequences": sums["sequences"] + metrics["sequences"]}
    return (grad_sum, sums), None

  zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  zero_sums = {key: jnp.zeros((), jnp.float32) for key in ("loss", "accuracy", "exact_match", "tokens", "sequences")}
  (grad_sum, sums), _ = jax.lax.scan(accumulate, (zero_grads, zero_sums), microbatches(batch, steps))
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grad_sum, params)
  metrics = {"loss": sums["loss"] / kept, "accuracy": sums["accuracy"] / kept,
             "exact_match": sums["exact_match"] / jnp.maximum(sums["sequences"], 1.0), "tokens": sums["tokens"],
             "sequences": sums["sequences"]}
  return grads, metrics


def _train_step(graphdef, chunk_tokens, accumulation_steps, state, batch):
  model, optimizer = nnx.merge(graphdef, state)
  if accumulation_steps == 1:
    (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch, chunk_tokens)
  else:
    grads, metrics = accumulated_gradients(model, batch, accumulation_steps, chunk_tokens)
  optimizer.update(model, grads)
  return nnx.state((model, optimizer)), {**metrics, "grad_norm": optax.tree.norm(grads)}


@functools.lru_cache(maxsize=16)
def _jitted_train_step(graphdef, chunk_tokens, accumulation_steps):
  # One compilation per model structure: a TrainStep built again for the same model (a resumed run, a test)
  # finds it here.
  return jax.jit(functools.partial(_train_step, graphdef, chunk_tokens, accumulation_steps), donate_argnums=0)


class TrainStep:
  """step(batch) -> metrics (device scalars, not fetched): one optimizer step on the model and optimizer.

  The arrays of model and optimizer travel as one pytree through a jitted pure function that donates them
  (nnx.jit would traverse both module graphs on every call, and without donation the parameters and Adam
  moments would exist twice at the step's peak). Between steps the newest arrays are held here, not in the
  modules: call sync() before reading the model or optimizer (evaluation, checkpoints).
  """

  def __init__(self, model, optimizer, *, loss_chunk_tokens=LOSS_CHUNK_TOKENS, gradient_accumulation_steps=1):
    self.model, self.optimizer = model, optimizer
    graphdef, self.state = nnx.split((model, optimizer))
    self._step = _jitted_train_step(graphdef, loss_chunk_tokens, gradient_accumulation_steps)
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


@functools.lru_cache(maxsize=16)
def _jitted_ensemble_step(graphdef, chunk_tokens, accumulation_steps):
  return jax.jit(jax.vmap(functools.partial(_train_step, graphdef, chunk_tokens, accumulation_steps)),
                 donate_argnums=0)


class EnsembleStep(TrainStep):
  """step(batches) -> metrics, each [M]: one optimizer step of each of M models of one structure (and their
  optimizers), their arrays stacked on a leading axis and `_train_step` vmapped over it, so the M share every
  launch. batches: {name: [M, B, ...]}, member i's batch at [i]. sync() writes member i's arrays into models[i] and
  optimizers[i]. The step is the first member's: the optimizers must be built from one config (each holds its own
  optax transformation, equal in what it computes, not in identity)."""

  def __init__(self, models, optimizers, *, loss_chunk_tokens=LOSS_CHUNK_TOKENS, gradient_accumulation_steps=1):
    self.models, self.optimizers = list(models), list(optimizers)
    splits = [nnx.split(pair) for pair in zip(self.models, self.optimizers)]
    graphdef = splits[0][0]
    structure, model_graph = jax.tree.structure(splits[0][1]), nnx.split(self.models[0])[0]
    if any(nnx.split(model)[0] != model_graph for model in self.models[1:]) or any(
        jax.tree.structure(state) != structure for _, state in splits[1:]):
      raise ValueError("models: expected models and optimizers of one structure (configs that differ in their seeds "
                       "alone)")
    self.state = jax.tree.map(lambda *arrays: jnp.stack(arrays), *[state for _, state in splits])
    self._step = _jitted_ensemble_step(graphdef, loss_chunk_tokens, gradient_accumulation_steps)
    self._synced = True

  def sync(self):
    if not self._synced:
      for i, pair in enumerate(zip(self.models, self.optimizers)):
        nnx.update(pair, jax.tree.map(lambda x, i=i: x[i], self.state))
      self._synced = True


def train_step(model, optimizer, batch, *, loss_chunk_tokens=LOSS_CHUNK_TOKENS, gradient_accumulation_steps=1):
  """One TrainStep call that leaves the result in model and optimizer (for one-off steps and tests)."""
  step = TrainStep(model, optimizer, loss_chunk_tokens=loss_chunk_tokens,
                   gradient_accumulation_steps=gradient_accumulation_steps)
  metrics = step(batch)
  step.sync()
  return metrics
