"""What a sweep's summary tells a newcomer (issue 52): a grid over names alone (mixers, variants) gets its table and a
line saying why no plot was drawn; the summary stores absolute paths, so it reads the same from anywhere."""

import json

from experiments.configs import mqar as mqar_configs
from sdm_jax.training import sweep, sweep_summary


def _fake_runner(run_dir, log):
  """Trains nothing: writes the final checkpoint's directory and the evaluation a real run would."""
  def train(config, directory, log):
    (directory / "checkpoints" / str(config.train.steps)).mkdir(parents=True)
    (directory / "config.json").write_text(config.to_json())
  sweep.run_one(run_dir, log=log, train_fn=train,
                evaluate_fn=lambda model, config: {"loss": 1.0, "accuracy": 0.5, "exact_match": 0.25})


def test_a_sweep_over_names_alone_says_why_it_draws_no_plot_and_stores_absolute_paths(tmp_path, monkeypatch):
  config = mqar_configs.get_config("cpu")
  monkeypatch.chdir(tmp_path)
  runs = sweep.plan(lambda point: sweep.apply(config, point), sweep.parse_grid("model.mixer=gdn2|kda", config), [0],
                    "study")
  sweep.run_sweep(runs, runner=_fake_runner, log=lambda line: None)
  lines = []
  sweep_summary.summarize(["study"], "study/summary", log=lines.append)
  assert any(line.startswith("no plot: a plot needs a numeric grid or evaluation field with two or more values")
             for line in lines), lines
  assert sorted(path.name for path in (tmp_path / "study").glob("summary*")) == ["summary.json", "summary.md"]
  stored = json.loads((tmp_path / "study" / "summary.json").read_text())
  assert stored["workdirs"] == [str(tmp_path / "study")]
  assert {row["run"] for row in stored["runs"]} == {str(tmp_path / "study" / name / "seed_0")
                                                    for name in ("mixer-gdn2", "mixer-kda")}
