"""The language model on a split: token loss, accuracy, perplexity and sequence exact match, averaged over batches,
and the task's own metrics (the corpus task's bits per byte)."""

import functools
import time

import jax
import numpy as np
from flax import nnx

from sdm_jax.data import make_iterator
from sdm_jax.data.pipeline import eval_metrics
from sdm_jax.models.loss import LOSS_CHUNK_TOKENS, loss_fn
from sdm_jax.models.sharding import global_batch


PROGRESS_SECONDS = 10


@functools.partial(nnx.jit, static_argnames="chunk_tokens")
def eval_step(model, batch, chunk_tokens=LOSS_CHUNK_TOKENS):
  return loss_fn(model, batch, chunk_tokens)[1]


def evaluate(model, config, mesh, split="validation", log=None):
  """Token loss, accuracy, perplexity and sequence exact match over config.train.eval_batches batches, and what
  the task derives from the loss (pipeline.eval_metrics). log, if given, gets a progress line after the first
  batch (its compilation) and every PROGRESS_SECONDS."""
  iterator = make_iterator(config, split, shard_index=jax.process_index(), shard_count=jax.process_count())
  totals = {"loss": 0.0, "accuracy": 0.0, "tokens": 0.0, "exact_match": 0.0, "sequences": 0.0}
  start = shown = time.perf_counter()
  for index, batch in zip(range(config.train.eval_batches), iterator):  # validation is finite
    metrics = jax.device_get(eval_step(model, global_batch(batch, mesh)))
    now = time.perf_counter()
    if log is not None and (index == 0 or now - shown >= PROGRESS_SECONDS):
      log(f"eval batch {index + 1}/{config.train.eval_batches} ({now - start:.0f} s)")
      shown = now
    for key in ("loss", "accuracy"):
      totals[key] += float(metrics[key]) * float(metrics["tokens"])
    totals["tokens"] += float(metrics["tokens"])
    totals["exact_match"] += float(metrics["exact_match"]) * float(metrics["sequences"])
    totals["sequences"] += float(metrics["sequences"])
  count = max(totals["tokens"], 1.0)
  loss = totals["loss"] / count
  return {"loss": loss, "accuracy": totals["accuracy"] / count, "perplexity": float(np.exp(min(loss, 50.0))),
          "exact_match": totals["exact_match"] / max(totals["sequences"], 1.0),
          **eval_metrics(config.data, split, loss)}
