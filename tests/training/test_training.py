"""The training program: exact resume, fallback from a damaged checkpoint, stopping on a non-finite
loss, the weight-decay mask; the loop that runs steps ahead of the host (metrics fetched at log, eval and
checkpoint steps; batches prefetched) against one that fetches every step. Training on several devices, FSDP
and resuming across device counts: test_multi_device.py."""

import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from sdm_jax.data import make_iterator
from sdm_jax.evaluation import lm_eval
from sdm_jax.models.sharding import global_batch, make_mesh, place_state
from sdm_jax.training import loop
from sdm_jax.training.checkpoint import Checkpointer
from sdm_jax.training.metrics import MetricsLog
from sdm_jax.training.optimizer import make_optimizer
from sdm_jax.training.steps import train_step
from training_helpers import assert_same_checkpoints, attention_config, checkpoint_contents, tiny_config, train_losses


def test_resume_continues_exactly(tmp_path):
  config = tiny_config(steps=6)
  loop.train(config, tmp_path / "straight", log=lambda _: None)
  loop.train(config, tmp_path / "resumed", stop_after=3, log=lambda _: None)
  assert max(train_losses(tmp_path / "resumed")) == 3
  loop.train(config, tmp_path / "resumed", log=lambda _: None)
  straight, resumed = train_losses(tmp_path / "straight"), train_losses(tmp_path / "resumed")
  assert sorted(resumed) == list(range(1, 7))
  np.testing.assert_allclose([resumed[s] for s in range(1, 7)], [straight[s] for s in range(1, 7)], rtol=1e-6)
  assert (tmp_path / "resumed" / "metrics.png").stat().st_size > 0


def test_damaged_latest_checkpoint_falls_back(tmp_path, capsys):
  config = tiny_config(steps=4)
  loop.train(config, tmp_path, log=lambda _: None)
  latest = tmp_path / "checkpoints" / "4"
  for f in latest.rglob("*"):
    if f.is_file():
      f.write_bytes(b"garbage")
  model, step, _ = loop.restore_for_eval(tmp_path, config)
  assert step == 2
  assert "unreadable" in capsys.readouterr().err


def nan_mask_in_batch(k):
  """loop.global_batch with batch k's mask NaN: step k's loss, gradients and every later parameter turn NaN
  through the real step, whatever runs it."""
  def poisoned(local_batch, mesh):
    poisoned.calls += 1
    if poisoned.calls == k:
      local_batch = {**local_batch, "mask": np.full_like(local_batch["mask"], np.nan)}
    return global_batch(local_batch, mesh)
  poisoned.calls = 0
  return poisoned


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path, monkeypatch):
  config = tiny_config(steps=6)
  monkeypatch.setattr(loop, "global_batch", nan_mask_in_batch(5))
  with pytest.raises(loop.TrainingDiverged, match="step 5.*last good checkpoint is step 4"):
    loop.train(config, tmp_path, log=lambda _: None)
  monkeypatch.undo()
  _, step, _ = loop.restore_for_eval(tmp_path, config)
  assert step == 4


def reference_train(config, workdir):
  """The loop before steps ran ahead of the host: one train_step and one jax.device_get per step, batches made
  when needed. Returns the records train() writes, less tokens_per_s."""
  train_cfg, mesh = config.train, make_mesh()
  model = loop.build(config, mesh)
  optimizer = make_optimizer(model, train_cfg)
  place_state(optimizer, mesh, train_cfg.fsdp)
  iterator = make_iterator(config, "train")
  checkpoints = Checkpointer(workdir, keep=train_cfg.keep_checkpoints)
  records, window = [], []
  for step in range(1, train_cfg.steps + 1):
    window.append(jax.device_get(train_step(model, optimizer, global_batch(next(iterator), mesh))))
    if step % train_cfg.log_every == 0 or step == train_cfg.steps:
      # Each metric's mean over the steps since the last log.
      records.append({"split": "train", "step": step,
                      **{k: sum(float(m[k]) for m in window) / len(window) for k in window[0]}})
      window = []
    if step % train_cfg.eval_every == 0 or step == train_cfg.steps:
      records.append({"split": "eval", "step": step, **lm_eval.evaluate(model, config, mesh)})
    if step % train_cfg.checkpoint_every == 0 or step == train_cfg.steps:
      checkpoints.save(step, model, optimizer, iterator.get_state(), config)
  checkpoints.close()
  return records


def test_loop_matches_a_loop_that_fetches_every_step(tmp_path):
  """Log, eval and checkpoint steps that fall apart (pending metrics of 1-4 steps, saves with batches
  prefetched past them): the same records and bitwise the same checkpoints, data state included."""
  config = attention_config(steps=12)
  config.train.log_every, config.train.eval_every, config.train.checkpoint_every = 5, 6, 4
  config.train.keep_checkpoints = 10
  expected = reference_train(config, tmp_path / "reference")
  loop.train(config, tmp_path / "run", log=lambda _: None)
  records = MetricsLog(tmp_path / "run").read()
  assert [r["step"] for r in records if "tokens_per_s" in r] == [10, 12]  # the first logged step compiles
  assert [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records] == expected
  assert [r["step"] for r in records if r["split"] == "train"] == [5, 10, 12]
  reference = checkpoint_contents(tmp_path / "reference")
  assert sorted(reference) == [4, 8, 12] and reference[4]["data"] == {"next_index": 4}
  assert_same_checkpoints(checkpoint_contents(tmp_path / "run"), reference)


def test_divergence_between_log_steps_stops_before_the_next_save(tmp_path, monkeypatch):
  """A NaN mask in batch 5 makes step 5's loss and every later parameter NaN, as a real divergence does. Step 5
  is no log step; the save at step 6 fetches steps 5-6 first, names step 5 and writes nothing."""
  config = attention_config(steps=10)
  config.train.log_every, config.train.checkpoint_every = 4, 3
  poisoned = nan_mask_in_batch(5)
  monkeypatch.setattr(loop, "global_batch", poisoned)
  with pytest.raises(loop.TrainingDiverged, match=r"\(nan\) at step 5;.*last good checkpoint is step 3 "):
    loop.train(config, tmp_path, log=lambda _: None)
  monkeypatch.undo()
  assert poisoned.calls <= 8  # the prefetch ran at most two batches past step 6
  assert sorted(checkpoint_contents(tmp_path)) == [3]
  assert [r["step"] for r in MetricsLog(tmp_path).read()] == [4]
  model, step, _ = loop.restore_for_eval(tmp_path, config)
  assert step == 3
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(nnx.state(model, nnx.Param))))


def test_resume_from_a_checkpoint_saved_with_batches_prefetched(tmp_path):
  """A run that stops at step 5 and loses that checkpoint resumes from step 3, saved while batches 4-5 were
  already pulled: it ends bitwise where an uninterrupted run ends."""
  config = attention_config(steps=9)
  config.train.log_every, config.train.checkpoint_every, config.train.keep_checkpoints = 4, 3, 10
  loop.train(config, tmp_path / "straight", log=lambda _: None)
  loop.train(config, tmp_path / "resumed", stop_after=5, log=lambda _: None)
  shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "5")
  assert loop.train(config, tmp_path / "resumed", log=lambda _: None) == 9
  straight, resumed = checkpoint_contents(tmp_path / "straight"), checkpoint_contents(tmp_path / "resumed")
  assert sorted(straight) == [3, 6, 9] and straight[9]["data"] == {"next_index": 9}
  assert_same_checkpoints(resumed, straight)


def test_masked_metrics_against_hand_computed_values():
  import jax.numpy as jnp
  from sdm_jax.models.loss import masked_cross_entropy
  logits = jnp.log(jnp.asarray([[[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]],
                                [[0.2, 0.5, 0.3], [0.6, 0.2, 0.2], [0.1, 0.1, 0.8]]]))
  targets = jnp.asarray([[0, 1, 0], [1, 2, 2]])
  mask = jnp.asarray([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
  loss, metrics = masked_cross_entropy(logits, targets, mask)
  expected = -(np.log(0.7) + np.log(0.8) + np.log(0.2) + np.log(0.8)) / 4
  np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
  assert float(metrics["accuracy"]) == 0.75  # the second row misses target 2 at position 1
  assert float(metrics["exact_match"]) == 0.5
