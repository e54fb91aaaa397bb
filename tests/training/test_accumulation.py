"""Gradient accumulation (train.gradient_accumulation_steps): microbatches give the whole batch's loss, metrics and
gradients, on plain rows and on packed rows whose microbatches keep different numbers of tokens; the config field
reaches the step the loop runs, and a split that cannot be made is refused before anything runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdm_jax.models import LanguageModel
from sdm_jax.models.loss import loss_fn
from sdm_jax.testing.errors import relative_error
from sdm_jax.training import loop, steps
from sdm_jax.training.config import ConfigError, check_config
from sdm_jax.training.metrics import MetricsLog
from sdm_jax.training.optimizer import make_optimizer
from training_helpers import attention_config

B, T, VOCAB = 8, 16, 64
MICROBATCHES = 4


def model_config():
  config = attention_config(steps=2).model
  config.vocab_size = VOCAB
  return config


def plain_batch(seed):
  """Random tokens; a random mask that keeps 3 to 16 tokens a row, one row with none."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, VOCAB, (B, T + 1))
  kept = rng.integers(3, T + 1, B)
  kept[5] = 0
  mask = (rng.random((B, T)).argsort(axis=1) < kept[:, None]).astype(np.float32)
  return {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32), "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
          "mask": jnp.asarray(mask)}


def packed_batch(seed):
  """Rows of 1 to 3 documents of random lengths, then padding (segment id 0, mask 0): rows of 15 kept tokens
  down to 4, so the microbatches' token counts differ."""
  rng = np.random.default_rng(seed)
  batch = plain_batch(seed)
  segment_ids, positions = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
  for row in range(B):
    used = int(rng.integers(4, T))
    cuts = np.sort(rng.choice(np.arange(1, used), size=int(rng.integers(0, 3)), replace=False))
    for document, (start, stop) in enumerate(zip([0, *cuts], [*cuts, used]), start=1):
      segment_ids[row, start:stop] = document
      positions[row, start:stop] = np.arange(stop - start)
  return {**batch, "mask": jnp.asarray((segment_ids > 0).astype(np.float32)), "segment_ids": jnp.asarray(segment_ids),
          "positions": jnp.asarray(positions)}


@nnx.jit
def whole_batch(model, batch):
  (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch)
  return grads, metrics


@nnx.jit(static_argnames="microbatches")
def accumulated(model, batch, microbatches):
  return steps.accumulated_gradients(model, batch, microbatches)


@pytest.mark.parametrize("make_batch", [plain_batch, packed_batch], ids=["plain", "packed"])
def test_four_microbatches_give_the_whole_batch(make_batch):
  model = LanguageModel(model_config(), rngs=nnx.Rngs(0))
  batch = make_batch(1)
  tokens_per_microbatch = np.asarray(batch["mask"]).reshape(B // MICROBATCHES, MICROBATCHES, T).sum(axis=(0, 2))
  assert len(set(tokens_per_microbatch)) > 1  # the microbatches' means must be weighted to give the batch's
  grads, metrics = whole_batch(model, batch)
  grads_accumulated, metrics_accumulated = accumulated(model, batch, MICROBATCHES)
  assert set(metrics_accumulated) == set(metrics)
  for key in metrics:
    np.testing.assert_allclose(metrics_accumulated[key], metrics[key], rtol=1e-5, err_msg=key)
  expected = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(grads))
  got = jax.tree.leaves(nnx.to_pure_dict(grads_accumulated))
  assert len(got) == len(expected)
  for (path, reference), leaf in zip(expected, got):
    assert leaf.dtype == reference.dtype
    assert relative_error(leaf, reference) < 1e-5, jax.tree_util.keystr(path)


def test_microbatches_take_strided_rows():
  batch = {"inputs": jnp.arange(8)[:, None] * jnp.ones((1, 3), jnp.int32)}
  split = steps.microbatches(batch, 4)["inputs"]
  assert split.shape == (4, 2, 3)
  np.testing.assert_array_equal(split[:, :, 0], [[0, 4], [1, 5], [2, 6], [3, 7]])
  with pytest.raises(ValueError, match="gradient_accumulation_steps: the batch's 8 rows do not split into 3"):
    steps.microbatches(batch, 3)


def test_train_step_with_accumulation_reports_the_whole_batch():
  config = model_config()
  batch = packed_batch(2)
  reports = {}
  for microbatches in (1, MICROBATCHES):
    model = LanguageModel(config, rngs=nnx.Rngs(0))
    optimizer = make_optimizer(model, attention_config(steps=2).train)
    reports[microbatches] = jax.device_get(steps.train_step(model, optimizer, batch,
                                                            gradient_accumulation_steps=microbatches))
  for key in reports[1]:
    np.testing.assert_allclose(reports[MICROBATCHES][key], reports[1][key], rtol=1e-5, err_msg=key)


def test_the_loop_steps_with_the_configured_accumulation(tmp_path, monkeypatch):
  seen = []
  real = steps.accumulated_gradients

  def spy(model, batch, microbatches, *args):
    seen.append((microbatches, batch["inputs"].shape))
    return real(model, batch, microbatches, *args)

  monkeypatch.setattr(steps, "accumulated_gradients", spy)
  steps._jitted_train_step.cache_clear()  # a step compiled by another test would not trace through the spy
  losses = {}
  for microbatches in (1, 2):
    config = attention_config(steps=1)
    config.train.gradient_accumulation_steps = microbatches
    loop.train(config, tmp_path / str(microbatches), log=lambda _: None)
    losses[microbatches] = [r for r in MetricsLog(tmp_path / str(microbatches)).read() if r["split"] == "train"][0]
  assert seen == [(2, (config.data.batch_size, config.data.seq_len))]
  for key in ("loss", "accuracy", "grad_norm"):
    np.testing.assert_allclose(losses[2][key], losses[1][key], rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("value, message", [
    (3, "does not split into 3 microbatches that each divide over 1 device"),
    (0, "expected an integer >= 1, got 0"),
    (True, "expected an integer >= 1, got True"),
])
def test_a_split_that_cannot_be_made_is_refused(value, message):
  config = attention_config(steps=2)  # a global batch of 4
  config.train.gradient_accumulation_steps = value
  with pytest.raises(ConfigError, match=f"config.train.gradient_accumulation_steps: .*{message}"):
    check_config(config)
