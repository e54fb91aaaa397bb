"""A run that later calls cannot damage (issue 22): a config that fails its checks writes nothing; a workdir
remembers its config; a damaged checkpoint is caught by its fingerprints, moved aside and saved again; a
non-finite gradient norm stops the run, a non-finite state is never saved; SIGTERM stops at a step boundary with a
checkpoint. The Ctrl-C test of the real program is tests/experiments/test_train_cli.py."""

import os
import pathlib
import shutil
import signal
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from sdm_jax.models.sharding import make_mesh
from sdm_jax.training import loop
from sdm_jax.training.checkpoint import Checkpointer, NonFiniteState
from sdm_jax.training.config import ConfigError, check_config
from sdm_jax.training.metrics import MetricsLog
from sdm_jax.training.optimizer import make_optimizer
from sdm_jax.training.steps import TrainStep
from sdm_jax.training.workdir import WorkdirError, checkpoint_steps, load_config
from training_helpers import assert_same_checkpoints, attention_config, checkpoint_contents, train_losses


def quiet(_):
  pass


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A finished 4-step run with checkpoints 2 and 4; tests work on copies."""
  workdir = tmp_path_factory.mktemp("finished") / "run"
  loop.train(attention_config(4), workdir, log=quiet)
  return workdir


@pytest.fixture
def run_copy(finished_run, tmp_path):
  return pathlib.Path(shutil.copytree(finished_run, tmp_path / "run"))


def snapshot(workdir):
  return {str(p.relative_to(workdir)): p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()}


def bad_config(field, value):
  config = attention_config(4)
  section, name = field.split(".")
  config[section][name] = value
  return config


@pytest.mark.parametrize("field, value, message", [
    ("model.mixer", "gdn3", r"config\.model\.mixer: .*'gdn3' \(did you mean 'gdn' or 'gdn2'\?\)"),
    ("model.impl", "trition", r"config\.model\.impl: expected one of \('auto', 'pallas', 'chunk', 'scan'\)"),
    ("model.pattern", "AX", r"config\.model: pattern: "),
    ("train.lerning_rate", 1.0, r"config\.train\.lerning_rate: no such field \(did you mean 'learning_rate'\?\)"),
])
def test_a_config_that_fails_its_checks_writes_nothing(run_copy, field, value, message):
  before = snapshot(run_copy)
  with pytest.raises(ConfigError, match=message):
    loop.train(bad_config(field, value), run_copy, log=quiet)
  assert snapshot(run_copy) == before
  _, step, _ = loop.restore_for_eval(run_copy, load_config(run_copy))  # eval and generate still find the run
  assert step == 4


def test_a_batch_that_does_not_divide_over_the_devices_is_refused():
  with pytest.raises(ConfigError, match=r"config\.data\.batch_size: .* 4 does not divide over 3 devices"):
    check_config(attention_config(4), device_count=3)


def test_a_workdir_remembers_its_config(run_copy):
  before = snapshot(run_copy)
  changed = attention_config(6)
  changed.model.width = 48
  with pytest.raises(WorkdirError) as error:
    loop.train(changed, run_copy, log=quiet)
  assert "model.width: 32 -> 48" in str(error.value) and "train.steps: 4 -> 6" in str(error.value)
  with pytest.raises(WorkdirError, match="--noresume.*--overwrite"):
    loop.train(attention_config(2), run_copy, resume=False, log=quiet)
  assert snapshot(run_copy) == before
  cadence = attention_config(4)
  cadence.train.log_every = 2  # a RESUMABLE_FIELDS change resumes (here: the run is already finished)
  assert loop.train(cadence, run_copy, log=quiet) == 4
  assert load_config(run_copy).train.log_every == 2
  loop.train(attention_config(2), run_copy, overwrite=True, log=quiet)
  assert checkpoint_steps(run_copy) == [2]
  assert sorted(train_losses(run_copy)) == [1, 2] and load_config(run_copy).train.steps == 2


def test_a_flipped_bit_is_caught_moved_aside_and_saved_again(finished_run, run_copy, capsys):
  """A bit flipped in an array file of checkpoint 4 changes what it reads back as: its fingerprint catches it.
  Evaluation skips it and leaves it; the resumed run moves it aside, trains steps 3-4 from checkpoint 2 and saves
  step 4 again, bitwise the checkpoint of the run that was never damaged. The fingerprints are compared before the
  finiteness check, so the report is the same whether the flip gives other finite numbers or non-finite ones (the
  stored chunks are compressed, so a flipped bit can decode to anything: two CI failures of
  this test were flips that read back as non-finite, reported by the finiteness check first)."""
  data = max((run_copy / "checkpoints" / "4" / "model").rglob("d/*"), key=lambda p: p.stat().st_size)
  damaged = bytearray(data.read_bytes())
  damaged[len(damaged) // 2] ^= 0x01
  data.write_bytes(bytes(damaged))
  config = attention_config(4)
  assert loop.restore_for_eval(run_copy, config)[1] == 2
  assert checkpoint_steps(run_copy) == [2, 4]
  assert "checkpoint step 4 is damaged" in capsys.readouterr().err
  assert loop.train(config, run_copy, log=quiet) == 4
  assert "moved it to" in capsys.readouterr().err
  assert (run_copy / "checkpoints_damaged" / "4").is_dir() and checkpoint_steps(run_copy) == [2, 4]
  assert_same_checkpoints(checkpoint_contents(run_copy), checkpoint_contents(finished_run))
  assert [r["step"] for r in MetricsLog(run_copy).read() if r["split"] == "train"] == [1, 2, 3, 4]


def test_a_non_finite_gradient_norm_stops_the_run_before_any_checkpoint(tmp_path, monkeypatch):
  """Step 1's loss is finite, its gradient norm is not: the run stops there, says there is no checkpoint to go
  back to, saves none and still plots."""
  class InfiniteGradNorm(TrainStep):
    def __call__(self, batch):
      return {**super().__call__(batch), "grad_norm": jnp.float32(np.inf)}

  monkeypatch.setattr(loop, "TrainStep", InfiniteGradNorm)
  with pytest.raises(loop.TrainingDiverged, match=r"non-finite grad_norm \(inf\) at step 1; .*There is no checkpoint"):
    loop.train(attention_config(4), tmp_path, log=quiet)
  assert checkpoint_steps(tmp_path) == [] and (tmp_path / "metrics.png").stat().st_size > 0


def test_a_state_with_a_non_finite_array_is_never_saved(tmp_path):
  config = attention_config(4)
  model = loop.build(config, make_mesh())
  optimizer = make_optimizer(model, config.train)
  model.head.kernel[...] = model.head.kernel[...].at[0, 0].set(jnp.nan)
  checkpoints = Checkpointer(tmp_path)
  with pytest.raises(NonFiniteState, match=r"\['head'\]\['kernel'\]"):
    checkpoints.save(2, model, optimizer, {"next_index": 2}, config)
  checkpoints.close()
  assert checkpoint_steps(tmp_path) == []


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread")
def test_sigterm_stops_at_a_step_boundary_with_a_checkpoint(tmp_path):
  config = attention_config(1000)
  config.train.checkpoint_every = 500
  handler = signal.getsignal(signal.SIGTERM)

  def log(line):
    if line.startswith("step 2/"):
      os.kill(os.getpid(), signal.SIGTERM)

  with pytest.raises(loop.TrainingInterrupted) as stopped:
    loop.train(config, tmp_path, log=log)
  assert stopped.value.signum == signal.SIGTERM and stopped.value.step == stopped.value.checkpoint == 3
  assert checkpoint_steps(tmp_path) == [3] and (tmp_path / "metrics.png").stat().st_size > 0
  assert signal.getsignal(signal.SIGTERM) is handler
