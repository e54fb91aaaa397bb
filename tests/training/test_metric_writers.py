"""What a run writes beside metrics.jsonl: TensorBoard event files holding the same scalars (and the restart
marker that hides the steps of a lost run after a resume), W&B through its API (mocked where it is called), the
training metrics as means over each logging window, and a jax.profiler trace of the steps train.profile_steps
names."""

import pathlib
import struct
import sys
import types

import jax
import numpy as np
import pytest

from sdm_jax.training import loop
from sdm_jax.training.config import ConfigError, check_config
from sdm_jax.training.metrics import MetricsLog, window_means
from training_helpers import attention_config


def read_event_file(path):
  """Every tensorboardX Event in one event file, in order (TFRecord framing: length, its CRC, the Event proto, its
  CRC)."""
  from tensorboardX.proto import event_pb2
  events, data, offset = [], pathlib.Path(path).read_bytes(), 0
  while offset < len(data):
    (length,) = struct.unpack("<Q", data[offset:offset + 8])
    events.append(event_pb2.Event.FromString(data[offset + 12:offset + 12 + length]))
    offset += 12 + length + 4
  return events


def event_files(directory):
  """The event files under `directory`, in the order they were opened."""
  return sorted(pathlib.Path(directory).glob("events.out.tfevents.*"), key=lambda p: read_event_file(p)[0].wall_time)


def read_events(directory):
  return [event for path in event_files(directory) for event in read_event_file(path)]


def scalars_of(events):
  """{(tag, step): value} of the scalar summaries among `events`."""
  return {(value.tag, event.step): value.simple_value for event in events if event.HasField("summary")
          for value in event.summary.value}


def expected_scalars(records):
  return {(f"{r['split']}/{key}", r["step"]): value for r in records for key, value in r.items()
          if key not in ("split", "step") and isinstance(value, float)}


def writers_config(steps=4):
  config = attention_config(steps)
  config.train.log_every, config.train.eval_every, config.train.checkpoint_every = 2, 4, 2
  return config


def test_tensorboard_holds_the_logged_scalars(tmp_path):
  loop.train(writers_config(), tmp_path, log=lambda _: None)
  records = MetricsLog(tmp_path).read()
  assert [(r["split"], r["step"]) for r in records] == [("train", 2), ("train", 4), ("eval", 4)]
  got, expected = scalars_of(read_events(tmp_path / "tensorboard")), expected_scalars(records)
  assert {"train/loss", "train/accuracy", "train/grad_norm", "eval/loss", "eval/perplexity"} <= {t for t, _ in got}
  assert set(got) == set(expected)
  for key, value in expected.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=str(key))  # stored as float32


def test_a_resumed_run_marks_its_restart_in_tensorboard(tmp_path):
  config = writers_config(steps=6)
  loop.train(config, tmp_path, stop_after=3, log=lambda _: None)  # logs step 2, checkpoints at 2 and 3
  loop.train(config, tmp_path, log=lambda _: None)  # resumes from step 3
  files = event_files(tmp_path / "tensorboard")
  assert len(files) == 2
  restarts = [[event.step for event in read_event_file(path) if event.HasField("session_log")] for path in files]
  # TensorBoard hides the events at and after a START marker's step that came before it: the fresh run marks
  # step 1, the resumed one the step after its checkpoint.
  assert restarts == [[1], [4]]
  steps = sorted(step for (tag, step) in scalars_of(read_event_file(files[1])) if tag == "train/loss")
  assert steps == [4, 6]


def test_logged_training_metrics_are_means_over_the_window(tmp_path):
  every_step = attention_config(steps=6)
  loop.train(every_step, tmp_path / "every_step", log=lambda _: None)
  windowed = attention_config(steps=6)
  windowed.train.log_every = 4  # windows: steps 1-4, then 5-6 (the last step logs)
  loop.train(windowed, tmp_path / "windowed", log=lambda _: None)
  per_step = {r["step"]: r for r in MetricsLog(tmp_path / "every_step").read() if r["split"] == "train"}
  logged = {r["step"]: r for r in MetricsLog(tmp_path / "windowed").read() if r["split"] == "train"}
  assert sorted(logged) == [4, 6]
  for step, window in ((4, range(1, 5)), (6, range(5, 7))):
    for key in ("loss", "accuracy", "grad_norm"):
      np.testing.assert_allclose(logged[step][key], np.mean([per_step[s][key] for s in window]), rtol=1e-6,
                                 err_msg=f"{key} at step {step}")
  assert logged[4]["loss"] != per_step[4]["loss"]  # the window's mean, not its last step


def test_window_means():
  assert window_means([{"loss": 1.0, "accuracy": 0.5}, {"loss": 2.0, "accuracy": 0.0}]) == {"loss": 1.5,
                                                                                          "accuracy": 0.25}
  with pytest.raises(ValueError, match="window: expected the metrics of at least one step"):
    window_means([])


class FakeWandb(types.ModuleType):
  """The wandb module at the API the writer calls: init(...) -> a run with log(data, step) and finish()."""

  def __init__(self):
    super().__init__("wandb")
    self.inits, self.logged, self.finished = [], [], 0

  def init(self, **kwargs):
    self.inits.append(kwargs)
    fake = self

    class Run:
      def log(self, data, step):
        fake.logged.append((step, dict(data)))

      def finish(self):
        fake.finished += 1
    return Run()


def test_wandb_gets_the_logged_scalars_and_a_resume_goes_on_in_the_same_run(tmp_path, monkeypatch):
  fake = FakeWandb()
  monkeypatch.setitem(sys.modules, "wandb", fake)
  config = writers_config(steps=4)
  config.train.wandb_project = "sdm-tests"
  loop.train(config, tmp_path, stop_after=2, log=lambda _: None)
  loop.train(config, tmp_path, log=lambda _: None)
  assert len(fake.inits) == 2 and fake.finished == 2
  first, second = fake.inits
  run_id = (tmp_path / "wandb_run_id").read_text().strip()
  assert first["id"] == second["id"] == run_id and first["resume"] == "allow"
  assert first["project"] == "sdm-tests" and first["dir"] == str(tmp_path)
  assert first["config"]["train"]["wandb_project"] == "sdm-tests" and first["config"]["model"]["pattern"] == "A"
  logged = {(tag, step): value for step, data in fake.logged for tag, value in data.items()}
  assert logged == expected_scalars(MetricsLog(tmp_path).read())


def test_wandb_project_without_wandb_warns_and_trains(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
  config = attention_config(steps=1)
  config.train.wandb_project = "sdm-tests"
  lines = []
  loop.train(config, tmp_path, log=lines.append)
  assert any("wandb_project is 'sdm-tests' but wandb is not installed" in line for line in lines)
  assert MetricsLog(tmp_path).read()[0]["step"] == 1


def test_profile_steps_write_a_trace_of_those_steps(tmp_path, monkeypatch):
  seen = []
  start, stop = jax.profiler.start_trace, jax.profiler.stop_trace
  annotation = jax.profiler.StepTraceAnnotation
  monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: (seen.append("start"), start(*a, **k))[1])
  monkeypatch.setattr(jax.profiler, "stop_trace", lambda: (seen.append("stop"), stop())[1])
  monkeypatch.setattr(jax.profiler, "StepTraceAnnotation",
                      lambda name, **k: (seen.append(f"{name} {k['step_num']}"), annotation(name, **k))[1])
  config = attention_config(steps=5)
  config.train.profile_steps = "2,3"
  lines = []
  loop.train(config, tmp_path, log=lines.append)
  assert seen == ["start", "train 2", "train 3", "stop"]
  traces = list((tmp_path / "profile").glob("plugins/profile/*/*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 0
  assert f"profile of steps 2-3 in {tmp_path / 'profile'}" in lines


@pytest.mark.parametrize("value", ["a,b", "3,2", "0", "1,2,3"])
def test_bad_profile_steps_are_refused(value):
  config = attention_config(steps=2)
  config.train.profile_steps = value
  with pytest.raises(ConfigError, match=f"config.train.profile_steps: expected \"FIRST,LAST\" .* got '{value}'"):
    check_config(config)
