"""summarize_run, its table and plot (experiments/summarize_runs.py): the numbers come from the run's own files."""

import json

import pytest

from sdm_jax.evaluation.run_summary import format_table, format_twins, plot_curves, summarize_run, twin_difference
from sdm_jax.training.metrics import MetricsLog, Progress


def _fake_run(path):
  path.mkdir()
  model = {"pattern": "D", "mixer": "kda", "impl": "pallas", "width": 256, "num_layers": 2}
  (path / "config.json").write_text(json.dumps({"model": model}))
  log = MetricsLog(path)
  for record in ({"split": "train", "step": 10, "loss": 3.0, "tokens_per_s": 100.0},
                 {"split": "eval", "step": 10, "loss": 2.0, "accuracy": 0.5},
                 {"split": "train", "step": 20, "loss": 1.0, "tokens_per_s": 120.0},
                 {"split": "eval", "step": 20, "loss": 1.5, "accuracy": 0.25}):
    log.write(record)


def test_summarize_run_reads_last_and_best(tmp_path):
  _fake_run(tmp_path / "run_a")
  row = summarize_run(tmp_path / "run_a")
  assert (row["run"], row["mixer"], row["impl"], row["steps"]) == ("run_a", "kda", "pallas", 20)
  assert (row["eval_accuracy"], row["best_eval_accuracy"], row["eval_loss"]) == (0.25, 0.5, 1.5)
  assert row["train_tokens_per_s"] == 120.0
  assert row["eval_curve"] == [(10, 0.5), (20, 0.25)]


def test_summarize_run_rejects_a_directory_without_metrics(tmp_path):
  with pytest.raises(ValueError, match="metrics.jsonl"):
    summarize_run(tmp_path)


def test_table_and_plot(tmp_path):
  _fake_run(tmp_path / "run_a")
  rows = [summarize_run(tmp_path / "run_a")]
  table = format_table(rows)
  assert "| run_a | D | kda | pallas | 256 x 2 | 20 | 0.2500 | 0.5000 | 1.5000 | 120 |" in table
  plot_curves(rows, tmp_path / "curves.png")
  assert (tmp_path / "curves.png").stat().st_size > 0


def test_progress_leaves_pauses_out_of_tokens_per_s(monkeypatch):
  clock = iter([0.0, 10.0, 30.0])
  monkeypatch.setattr("sdm_jax.training.metrics.time.perf_counter", lambda: next(clock))
  progress = Progress(0, 100)
  progress.line(1, {"loss": 1.0, "accuracy": 0.0}, 100)  # t = 0: the first logged step starts the clock
  progress.line(2, {"loss": 1.0, "accuracy": 0.0}, 100)  # t = 10: 100 tokens in 10 s
  assert progress.tokens_per_s == pytest.approx(10.0)
  progress.exclude(10.0)  # 10 s of evaluation
  progress.line(3, {"loss": 1.0, "accuracy": 0.0}, 100)  # t = 30: 200 tokens in 30 - 10 s
  assert progress.tokens_per_s == pytest.approx(10.0)


def test_twin_difference_finds_the_first_differing_step(tmp_path):
  _fake_run(tmp_path / "a")
  _fake_run(tmp_path / "b")
  same = twin_difference(tmp_path / "a", tmp_path / "b")
  assert same == {"steps_compared": 2, "first_differing_step": None, "max_relative_loss_difference": 0.0}
  MetricsLog(tmp_path / "b").write({"split": "train", "step": 30, "loss": 0.5})  # b only: not compared
  _fake_run(tmp_path / "c")
  (tmp_path / "c" / "metrics.jsonl").write_text(
      (tmp_path / "c" / "metrics.jsonl").read_text().replace('"loss": 1.0', '"loss": 1.25'))
  differs = twin_difference(tmp_path / "b", tmp_path / "c")
  assert differs["steps_compared"] == 2 and differs["first_differing_step"] == 20
  assert differs["max_relative_loss_difference"] == pytest.approx(0.25)
  line = format_twins([(summarize_run(tmp_path / "b"), summarize_run(tmp_path / "c"), differs)]).splitlines()[-1]
  assert line.startswith("| b | c | 2 | 20 | 2.5e-01 |")
  (tmp_path / "d").mkdir()
  (tmp_path / "d" / "config.json").write_text((tmp_path / "a" / "config.json").read_text())
  MetricsLog(tmp_path / "d").write({"split": "train", "step": 5, "loss": 1.0})
  with pytest.raises(ValueError, match="in common"):
    twin_difference(tmp_path / "a", tmp_path / "d")
