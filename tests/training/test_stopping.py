"""How a run stops (issue 52): data found damaged mid-run stops it at a step boundary with a checkpoint there, naming
the shard; at most two steps are in flight, so a stop does not wait for every step dispatched; a second Ctrl-C stops
a real training process at once, with a message and exit code 130, never an abort; Ctrl-C on a sweep (as a terminal
sends it, to the sweep's process group) stops the running run at a step boundary with its checkpoint, and the sweep
with the command that resumes it."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading

import jax
import pytest

from sdm_jax.data import DataError
from sdm_jax.training import loop
from sdm_jax.training.workdir import checkpoint_steps
from training_helpers import attention_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
MQAR = str(ROOT / "experiments" / "configs" / "mqar.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
# A 1-layer width-32 attention model on 4 sequences of 32 tokens: each step takes milliseconds.
TINY = ["--config.model.pattern=A", "--config.model.width=32", "--config.model.num_layers=1",
        "--config.data.batch_size=4", "--config.train.log_every=1", "--config.train.eval_every=100000",
        "--config.train.checkpoint_every=100000"]


def quiet(_):
  pass


class FailingIterator:
  """A data iterator whose pull number `fail_at` (from 1) raises DataError, as a shard damaged mid-run does."""

  def __init__(self, iterator, fail_at):
    self.iterator, self.fail_at, self.pulls = iterator, fail_at, 0

  def __next__(self):
    self.pulls += 1
    if self.pulls == self.fail_at:
      raise DataError("corpus shard 'train-00003.array_record' is damaged: its record 7 does not read")
    return next(self.iterator)

  def get_state(self):
    return self.iterator.get_state()

  def set_state(self, state):
    self.iterator.set_state(state)


@pytest.mark.parametrize("fail_at, stopped, kept", [(5, 3, [3]), (1, 0, [])])
def test_damaged_data_mid_run_stops_at_a_step_boundary_with_a_checkpoint_naming_the_shard(tmp_path, monkeypatch,
                                                                                          fail_at, stopped, kept):
  # Batches are pulled two ahead: pull 5 fails while batches 3 and 4 are queued, so the run stops after step 3.
  # A failing first pull stops it before any step, with nothing new to save.
  config = attention_config(20)
  config.train.checkpoint_every = 100
  make_iterator = loop.make_iterator
  monkeypatch.setattr(loop, "make_iterator",
                      lambda *args, **kwargs: FailingIterator(make_iterator(*args, **kwargs), fail_at))
  with pytest.raises(loop.TrainingDataError, match=rf"train-00003.array_record' is damaged: .*; stopped at step "
                                                   rf"{stopped}\. "):
    loop.train(config, tmp_path, log=quiet)
  assert checkpoint_steps(tmp_path) == kept and (tmp_path / "metrics.png").stat().st_size > 0


def test_at_most_two_steps_are_in_flight(tmp_path, monkeypatch):
  """A step is dispatched only after the one two before it finished: a stop waits for at most two steps (an
  unbounded queue of CPU steps once took a Ctrl-C 13 minutes)."""
  config = attention_config(6)
  config.train.log_every = config.train.checkpoint_every = config.train.eval_every = 100
  events = []
  step_class = loop.TrainStep

  class Recorded(step_class):
    def __call__(self, batch):
      events.append("dispatch")
      return super().__call__(batch)

  block = jax.block_until_ready

  def recorded_block(tree):
    events.append("wait")
    return block(tree)

  monkeypatch.setattr(loop, "TrainStep", Recorded)
  monkeypatch.setattr(loop.jax, "block_until_ready", recorded_block)
  loop.train(config, tmp_path, log=quiet)
  assert events == ["dispatch"] + ["dispatch", "wait"] * 5


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread")
def test_a_signal_between_two_runs_stops_the_next_at_its_first_step(tmp_path):
  """Contexts nest: train() inside a sweep's StopSignals sees a signal the sweep got before the run started."""
  with loop.StopSignals() as outer:
    os.kill(os.getpid(), signal.SIGTERM)
    assert outer.signum == signal.SIGTERM
    with pytest.raises(loop.TrainingInterrupted) as stopped:
      loop.train(attention_config(20), tmp_path, log=quiet)
  assert stopped.value.step == stopped.value.checkpoint == 1 and checkpoint_steps(tmp_path) == [1]


def _program(name, *args):
  return [sys.executable, "-m", f"experiments.{name}", *args]


def test_a_second_ctrl_c_stops_a_training_process_at_once_without_an_abort(tmp_path):
  process = subprocess.Popen(
      _program("train", f"--config={MQAR}:demo", f"--workdir={tmp_path}", *TINY, "--config.train.steps=100000"),
      cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  first = None
  for line in process.stdout:
    if first is None and line.startswith("step 3/"):
      process.send_signal(signal.SIGINT)
      first = 3
    elif first is not None and line.startswith("step "):
      # The run logs the step it stops at, then saves a checkpoint and plots: the second signal comes meanwhile.
      process.send_signal(signal.SIGINT)
      break
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 130, stderr
  assert "SIGINT again: stopped at once, without saving; the newest checkpoint is kept" in stderr
  assert "Fatal" not in stderr and "Traceback" not in stderr and "terminate called" not in stderr


def test_ctrl_c_on_a_sweep_saves_the_running_run_and_prints_the_resume_command(tmp_path):
  workdir = tmp_path / "sweep"
  command = _program("sweep", f"--config={MQAR}:demo", f"--workdir={workdir}", *TINY, "--config.train.steps=100000",
                     "--grid=model.width=32")
  # A terminal's Ctrl-C reaches its whole foreground process group: the sweep, here the leader of its own group.
  process = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
  for line in process.stdout:
    if line.strip().startswith("step 3/"):
      os.killpg(process.pid, signal.SIGINT)
      break
  stdout, stderr = process.communicate(timeout=300)
  assert process.returncode == 130, stdout[-2000:] + stderr
  assert "Traceback" not in stdout + stderr and "Resume the sweep with:" in stderr
  stopped = int(stdout.split("stopped by SIGINT at step ")[1].split(";")[0])
  run_dir = workdir / "width-32" / "seed_0"
  assert checkpoint_steps(run_dir) == [stopped] and stopped >= 3
  records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, stopped + 1))


def test_a_shard_damaged_without_changing_its_size_stops_the_run_naming_it(tmp_path):
  """Bytes flipped inside a train shard after the run started: its size and record count still check out, the
  records fail their hashes only as they are read (here as the resumed iterator reads its way back to its state;
  a damage met with batches queued is test_damaged_data_mid_run_...). The program stops with one line naming the
  shard and exit code 2, the checkpoints kept; evaluation (its shards intact) shows its progress."""
  from sdm_jax.data import prepare, shards
  corpus = tmp_path / "corpus"
  manifest = prepare.prepare("pydoc", "train:300", corpus, validation_fraction=0.1, log=quiet)
  args = [f"--config={ROOT / 'experiments' / 'configs' / 'corpus.py'}:cpu,{corpus}", f"--workdir={tmp_path / 'run'}",
          "--config.data.seq_len=32", "--config.data.batch_size=2", "--config.train.eval_batches=1",
          "--config.train.log_every=1", "--config.train.checkpoint_every=3", "--config.train.eval_every=1000",
          "--config.model.pattern=A"]  # attention for the config's GDN-2: the damage met does not depend on the model
  first = subprocess.run(_program("train", *args, "--stop_after=3"), cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=300)
  assert first.returncode == 0 and checkpoint_steps(tmp_path / "run") == [3], first.stderr[-2000:]
  shard = corpus / manifest["splits"]["train"]["shards"][0]["path"]
  data = bytearray(shard.read_bytes())
  for index in range(64, len(data) // 2, 97):  # most records; the index at the end stays whole
    data[index] ^= 0x55
  shard.write_bytes(bytes(data))
  shards.check_shard(corpus, manifest["splits"]["train"]["shards"][0])  # the checks at start pass
  damaged = subprocess.run(_program("train", *args), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert damaged.returncode == 2, damaged.stdout[-2000:] + damaged.stderr[-2000:]
  assert damaged.stderr.startswith(f"error: corpus shard {str(shard)!r} is damaged: its record ")
  assert damaged.stderr.count("\n") == 1 and "prepare the corpus again" in damaged.stderr
  # Met while the resumed iterator reads its way back to its state, or at a later batch (a checkpoint there).
  kept = checkpoint_steps(tmp_path / "run")
  assert kept[0] == 3 and f"The last good checkpoint is step {kept[-1]} in" in damaged.stderr
  assert "; nothing was trained. " in damaged.stderr or f"; stopped at step {kept[-1]}. " in damaged.stderr
  evaluated = subprocess.run(_program("eval", f"--workdir={tmp_path / 'run'}"), cwd=tmp_path, env=ENV,
                             capture_output=True, text=True, timeout=300)
  assert evaluated.returncode == 0, evaluated.stderr[-2000:]
  assert f"evaluating step {kept[-1]} on 1 validation batches\neval batch 1/1 (" in evaluated.stdout
