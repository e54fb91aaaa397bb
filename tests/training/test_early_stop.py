"""Early stop at a target accuracy (train.stop_at_accuracy): the first evaluation that reaches it is the run's last
step, with a checkpoint and the training metrics since the last log; a second call trains nothing; the sweep's
status and the final step read it back; the target is checked and cannot change when a run resumes."""

import pytest

from sdm_jax.training import loop, sweep
from sdm_jax.training.config import ConfigError, check_config
from sdm_jax.training.metrics import MetricsLog
from sdm_jax.training.workdir import WorkdirError, checkpoint_steps
from training_helpers import attention_config


def scripted_evaluations(monkeypatch, accuracies):
  """Replaces the loop's evaluation: the i-th call returns accuracies[i]; returns the list of calls made."""
  calls = []

  def evaluate(model, config, mesh):
    calls.append(len(calls))
    return {"loss": 1.0, "accuracy": accuracies[len(calls) - 1], "perplexity": 2.7, "exact_match": 0.0}
  monkeypatch.setattr(loop, "evaluate", evaluate)
  return calls


def stop_config(steps=10, target=0.9):
  config = attention_config(steps)
  config.train.log_every, config.train.eval_every, config.train.checkpoint_every = 3, 2, 100
  config.train.stop_at_accuracy = target
  return config


def test_the_first_evaluation_at_the_target_ends_the_run_with_a_checkpoint(tmp_path, monkeypatch):
  calls = scripted_evaluations(monkeypatch, [0.2, 0.89, 0.9, 1.0, 1.0])
  config, lines = stop_config(), []
  assert loop.train(config, tmp_path, log=lines.append) == 6
  records = MetricsLog(tmp_path).read()
  assert [r["step"] for r in records if r["split"] == "eval"] == [2, 4, 6]
  # Logged at step 3 (log_every) and at the stop, step 6: no training step is left out of the records.
  assert [r["step"] for r in records if r["split"] == "train"] == [3, 6]
  assert checkpoint_steps(tmp_path) == [6]
  assert any("reached train.stop_at_accuracy = 0.9 at step 6" in line for line in lines)
  assert loop.final_step(tmp_path, config.train) == 6 and loop.final_step(tmp_path, config.train.to_dict()) == 6
  # A second call trains and evaluates nothing.
  lines.clear()
  assert loop.train(config, tmp_path, log=lines.append) == 6
  assert len(calls) == 3 and MetricsLog(tmp_path).read() == records
  assert any("reached train.stop_at_accuracy = 0.9: the run ended there" in line for line in lines)


def test_without_a_target_every_step_trains(tmp_path, monkeypatch):
  scripted_evaluations(monkeypatch, [1.0] * 5)
  config = stop_config(steps=6, target=0.0)
  assert loop.train(config, tmp_path, log=lambda _: None) == 6
  assert loop.final_step(tmp_path, config.train) == 6
  # The target is looked for only when set; a run never reaching it ends at train.steps.
  assert loop.target_step(MetricsLog(tmp_path).read(), 0.0) is None
  assert loop.target_step([{"split": "eval", "step": 2, "accuracy": 0.5}], 0.9) is None
  assert loop.final_step(tmp_path, {"steps": 6}) == 6  # a config saved before the field


def test_sweep_status_and_final_evaluation_use_the_stopped_step(tmp_path, monkeypatch):
  scripted_evaluations(monkeypatch, [0.95] * 4)
  config = stop_config(steps=8)
  (run,) = sweep.plan(lambda point: config, [], [0], tmp_path)
  sweep.prepare(run)
  evaluated = []

  def evaluate(model, config):
    evaluated.append(config.data.seq_len)
    return {"loss": 1.0, "accuracy": 0.97, "exact_match": 0.5}
  sweep.run_one(run.directory, log=lambda _: None, evaluate_fn=evaluate)
  assert checkpoint_steps(run.directory) == [2] and evaluated == [config.data.seq_len]
  assert sweep._read_json(run.directory / sweep.EVAL)["step"] == 2
  assert sweep.status(run.directory, loop.final_step(run.directory, run.config.train)) == "done"
  assert sweep.run_sweep([run], runner=lambda run_dir, log: pytest.fail("ran again"), log=lambda _: None) == {
      run.name: "skipped"}


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_bad_targets_are_refused(value):
  config = stop_config(target=value)
  with pytest.raises(ConfigError, match=r"config.train.stop_at_accuracy: expected an accuracy in \(0, 1\], or 0"):
    check_config(config)


def test_a_resume_cannot_change_the_target(tmp_path, monkeypatch):
  scripted_evaluations(monkeypatch, [0.1] * 5)
  config = stop_config(steps=4)
  config.train.checkpoint_every = 2
  loop.train(config, tmp_path, stop_after=2, log=lambda _: None)
  config.train.stop_at_accuracy = 0.05
  with pytest.raises(WorkdirError, match=r"train.stop_at_accuracy: 0.9 -> 0.05"):
    loop.train(config, tmp_path, log=lambda _: None)
