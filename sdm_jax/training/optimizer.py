"""AdamW with a warmup schedule and global-norm clipping; no weight decay on A_log, dt_bias, norms, biases."""

import jax
import optax
from flax import nnx

from sdm_jax.models import no_decay_mask

SCHEDULES = ("cosine", "wsd", "constant")


def make_schedule(train):
  """The learning rate against the optimizer's step count (0 before the first update), by train.schedule:

  - "cosine": linear warmup from 0 to train.learning_rate over train.warmup_steps, then a cosine down to
    final_lr_fraction of it at train.steps (flame's recipe);
  - "wsd": warmup, stable, decay: the same warmup, the peak held, then a linear decay to final_lr_fraction of it
    over the last train.decay_fraction of train.steps (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
    Training Beyond Fixed Training Durations", where a 20 % cooldown matches the cosine's loss); a run can be
    extended from any checkpoint of its stable phase;
  - "constant": the same warmup, then the peak to the end.
  """
  peak, warmup = train.learning_rate, train.warmup_steps
  end = peak * train.final_lr_fraction
  name = train.get("schedule", "cosine")  # configs saved before the field existed
  if name == "cosine":
    return optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=peak, warmup_steps=warmup,
                                              decay_steps=max(train.steps, warmup + 1), end_value=end)
  if name == "constant":
    return optax.warmup_constant_schedule(init_value=0.0, peak_value=peak, warmup_steps=warmup)
  if name == "wsd":
    decay_steps = max(1, round(train.decay_fraction * train.steps))
    decay_start = max(warmup, train.steps - decay_steps)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak),
         optax.linear_schedule(peak, end, decay_steps)], boundaries=[warmup, decay_start])
  raise ValueError(f"train.schedule: expected one of {SCHEDULES}, got {name!r}")


def make_optimizer(model, train):
  """nnx.Optimizer over the model's Params; `train` holds learning_rate, warmup_steps, steps, ..."""
  decay_mask = lambda params: jax.tree.map(lambda no_decay: not no_decay, no_decay_mask(params))
  tx = optax.chain(
      optax.clip_by_global_norm(train.grad_clip),
      optax.adamw(make_schedule(train), b1=train.b1, b2=train.b2, eps=1e-8, weight_decay=train.weight_decay,
                  mask=decay_mask))
  return nnx.Optimizer(model, tx, wrt=nnx.Param)
