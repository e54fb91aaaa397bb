"""The training program: exact resume, fallback from a damaged checkpoint, stopping on a non-finite
loss, the weight-decay mask, and data-parallel training on 4 forced host devices."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from experiments.configs.mqar import get_config
from sdm_jax.training import loop
from sdm_jax.training.metrics import MetricsLog

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tiny_config(steps=6):
  config = get_config("demo")
  config.data.seq_len, config.data.batch_size = 32, 4
  config.data.num_kv_pairs = config.data.num_queries = 4
  config.model.width, config.model.num_layers = 32, 1
  config.train.steps, config.train.warmup_steps = steps, 2
  config.train.log_every, config.train.eval_every, config.train.checkpoint_every = 1, 1000, 2
  config.train.eval_batches = 1
  return config


def train_losses(workdir):
  return {r["step"]: r["loss"] for r in MetricsLog(workdir).read() if r["split"] == "train"}


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
  assert "unreadable" in capsys.readouterr().out


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path, monkeypatch):
  config = tiny_config(steps=6)
  real_step, calls = loop.train_step, []

  def poisoned(model, optimizer, batch):
    calls.append(1)
    metrics = dict(real_step(model, optimizer, batch))
    if len(calls) == 5:
      metrics["loss"] = np.float32(np.nan)
    return metrics

  monkeypatch.setattr(loop, "train_step", poisoned)
  with pytest.raises(loop.TrainingDiverged, match="step 5.*last good checkpoint is step 4"):
    loop.train(config, tmp_path, log=lambda _: None)
  monkeypatch.undo()
  _, step, _ = loop.restore_for_eval(tmp_path, config)
  assert step == 4


def test_data_parallel_on_four_host_devices(tmp_path):
  """The same step runs on a 4-device mesh (batch sharded, FSDP parameters) and matches 1 device."""
  script = f"""
import sys, json
sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'tests' / 'training')!r})
import jax
from test_training import tiny_config, train_losses
from sdm_jax.training import loop
config = tiny_config(steps=3)
config.train.fsdp = FSDP
loop.train(config, sys.argv[1], log=lambda _: None)
print(json.dumps({{"devices": len(jax.devices()), "losses": train_losses(sys.argv[1])}}))
"""
  results = {}
  for name, devices, fsdp in (("one", 1, False), ("four", 4, True)):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script.replace("FSDP", str(fsdp)), str(tmp_path / name)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    results[name] = json.loads(out.stdout.strip().splitlines()[-1])
  assert results["four"]["devices"] == 4
  one, four = results["one"]["losses"], results["four"]["losses"]
  np.testing.assert_allclose([four[k] for k in sorted(four)], [one[k] for k in sorted(one)], rtol=1e-4)


def test_masked_metrics_against_hand_computed_values():
  import jax.numpy as jnp
  from sdm_jax.training.steps import masked_cross_entropy
  logits = jnp.log(jnp.asarray([[[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]],
                                [[0.2, 0.5, 0.3], [0.6, 0.2, 0.2], [0.1, 0.1, 0.8]]]))
  targets = jnp.asarray([[0, 1, 0], [1, 2, 2]])
  mask = jnp.asarray([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
  loss, metrics = masked_cross_entropy(logits, targets, mask)
  expected = -(np.log(0.7) + np.log(0.8) + np.log(0.2) + np.log(0.8)) / 4
  np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
  assert float(metrics["accuracy"]) == 0.75  # the second row misses target 2 at position 1
  assert float(metrics["exact_match"]) == 0.5
