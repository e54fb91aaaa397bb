"""AdamW with warmup-cosine and global-norm clipping; no weight decay on A_log, dt_bias, norms, biases."""

import jax
import optax
from flax import nnx

from sdm_jax.models import no_decay_mask


def make_schedule(train):
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=train.learning_rate, warmup_steps=train.warmup_steps,
      decay_steps=max(train.steps, train.warmup_steps + 1), end_value=train.learning_rate * train.final_lr_fraction)


def make_optimizer(model, train):
  """nnx.Optimizer over the model's Params; `train` holds learning_rate, warmup_steps, steps, ..."""
  decay_mask = lambda params: jax.tree.map(lambda no_decay: not no_decay, no_decay_mask(params))
  tx = optax.chain(
      optax.clip_by_global_norm(train.grad_clip),
      optax.adamw(make_schedule(train), b1=train.b1, b2=train.b2, eps=1e-8, weight_decay=train.weight_decay,
                  mask=decay_mask))
  return nnx.Optimizer(model, tx, wrt=nnx.Param)
