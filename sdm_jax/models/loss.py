"""The language model's objective: masked next-token cross-entropy scored over chunks of tokens, so the fp32
[B, T, vocab] logits never exist at once, and the metrics of a batch (loss, accuracy, sequence exact match).
Training differentiates it (sdm_jax.training.steps); evaluation averages its metrics (sdm_jax.evaluation)."""

import inspect

import jax
import jax.numpy as jnp

# Tokens scored per chunk: 2,048 x 32,000 fp32 logits are 0.25 GiB, and [2048, D] x [D, vocab] is still a matmul
# large enough to run at full rate.
LOSS_CHUNK_TOKENS = 2048


@jax.custom_vjp
def head_logits(features, kernel):
  """features [N, D] in the compute dtype, kernel [D, vocab] (fp32 parameters) -> fp32 logits [N, vocab].

  The backward casts the logits' cotangent to the compute dtype before its two matmuls, as a bf16 autocast
  does: left to autodiff, the fp32 cotangent makes both run in fp32 (TF32 on the GPU; 13 ms of a 150 ms
  step at the reference shape, benchmarks/train/2026-12-01_h200_train_kda_call1.json). The kernel's
  gradient comes back fp32.
  """
  return jnp.dot(features, kernel.astype(features.dtype), preferred_element_type=jnp.float32)


def _head_logits_fwd(features, kernel):
  return head_logits(features, kernel), (features, kernel)


def _head_logits_bwd(residuals, d_logits):
  features, kernel = residuals
  d_logits = d_logits.astype(features.dtype)
  d_features = jnp.dot(d_logits, kernel.astype(features.dtype).T, preferred_element_type=jnp.float32)
  d_kernel = jnp.dot(features.T, d_logits, preferred_element_type=jnp.float32)
  return d_features.astype(features.dtype), d_kernel.astype(kernel.dtype)


head_logits.defvjp(_head_logits_fwd, _head_logits_bwd)


def token_scores(features, kernel, targets, chunk_tokens=LOSS_CHUNK_TOKENS):
  """features [B, T, D] (the final norm's output), kernel [D, vocab] (the head), targets [B, T] int ->
  (nll [B, T] fp32, correct [B, T] bool: the argmax is the target).

  The logits of chunk_tokens tokens at a time are formed, reduced and dropped; the backward forms them again
  (jax.checkpoint), so the loss's memory is one chunk's logits whatever B x T is.
  """
  if not isinstance(chunk_tokens, int) or chunk_tokens < 1:
    raise ValueError(f"chunk_tokens: expected a positive number of tokens, got {chunk_tokens!r}")
  B, T, D = features.shape
  n = B * T
  chunk = min(chunk_tokens, n)
  pad = -n % chunk
  flat_features = jnp.pad(features.reshape(n, D), ((0, pad), (0, 0))).reshape(-1, chunk, D)
  flat_targets = jnp.pad(targets.reshape(n), (0, pad)).reshape(-1, chunk)

  @jax.checkpoint
  def score(chunk_features, chunk_targets):
    logits = head_logits(chunk_features, kernel)
    target_logit = jnp.take_along_axis(logits, chunk_targets[:, None], axis=-1)[:, 0]
    return jax.nn.logsumexp(logits, axis=-1) - target_logit, jnp.argmax(logits, axis=-1) == chunk_targets

  nll, correct = jax.lax.map(lambda args: score(*args), (flat_features, flat_targets))
  unflat = lambda x: x.reshape(-1)[:n].reshape(B, T)
  return unflat(nll), unflat(correct)


def masked_metrics(nll, correct, mask):
  """nll [B, T], correct [B, T] bool, mask [B, T] -> (mean loss over the mask, metrics dict)."""
  count = jnp.maximum(jnp.sum(mask), 1.0)
  loss = jnp.sum(nll * mask) / count
  accuracy = jnp.sum(correct * mask) / count
  # Exact match: a sequence counts only if every scored token is right (RULER's scoring).
  scored = jnp.any(mask > 0, axis=-1)
  sequences = jnp.sum(scored)
  exact = jnp.sum(jnp.all(correct | (mask == 0), axis=-1) & scored) / jnp.maximum(sequences, 1)
  return loss, {"loss": loss, "accuracy": accuracy, "exact_match": exact, "tokens": jnp.sum(mask),
                "sequences": sequences}


def masked_cross_entropy(logits, targets, mask):
  """The same metrics from whole logits [B, T, vocab] (the plain form `token_scores` is held to)."""
  logits = logits.astype(jnp.float32)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
  return masked_metrics(nll, jnp.argmax(logits, -1) == targets, mask)


def packing_arguments(features, batch):
  """The packed batch's "segment_ids" and "positions" (DESIGN.md section 9) that the callable `features` takes, as
  keyword arguments: a model that does not take them yet trains on the tokens alone."""
  accepted = inspect.signature(features).parameters
  return {key: batch[key] for key in ("segment_ids", "positions") if key in batch and key in accepted}


def loss_fn(model, batch, chunk_tokens=LOSS_CHUNK_TOKENS):
  """The model's masked next-token loss on batch {"inputs", "targets", "mask"} (and "segment_ids", "positions" of
  packed documents, see packing_arguments); returns (loss, metrics)."""
  features = model.features(batch["inputs"], **packing_arguments(model.features, batch))
  nll, correct = token_scores(features, model.head.kernel[...], batch["targets"], chunk_tokens)
  return masked_metrics(nll, correct, batch["mask"])
