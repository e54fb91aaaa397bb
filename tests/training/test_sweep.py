"""Sweeps: the grid's parsing, expansion and names; which runs are skipped or resumed; the summary's intervals
and files."""

import json
import shutil
import threading
import math
import re

import ml_collections
import pytest

from experiments.configs import mqar as mqar_configs
from sdm_jax.training import sweep, sweep_summary
from sdm_jax.training.config import ConfigError


@pytest.fixture(scope="module")
def demo():
  config = mqar_configs.get_config("demo")
  config.train.steps = 4
  return config


def test_grid_parses_by_field_type_and_expands_first_axis_slowest(demo):
  axes = sweep.parse_grid("model.mixer=gdn|kda; data.seq_len,data.num_kv_pairs=32,4|64,8;"
                          "train.learning_rate=3e-3|1e-2;data.noise=true|false", demo)
  assert [axis.fields for axis in axes] == [("model.mixer",), ("data.seq_len", "data.num_kv_pairs"),
                                            ("train.learning_rate",), ("data.noise",)]
  assert axes[1].values == ((32, 4), (64, 8)) and axes[2].values == ((3e-3,), (1e-2,))
  assert axes[3].values == ((True,), (False,))
  points = sweep.expand(axes)
  assert len(points) == 16
  assert points[0] == {"model.mixer": "gdn", "data.seq_len": 32, "data.num_kv_pairs": 4,
                       "train.learning_rate": 3e-3, "data.noise": True}
  assert points[1]["data.noise"] is False and points[8]["model.mixer"] == "kda"
  names = sweep.point_names(points)
  assert names[0] == "mixer-gdn_seq_len-32_num_kv_pairs-4_learning_rate-0.003_noise-True"
  assert len(set(names)) == 16
  config = sweep.apply(demo, points[-1])
  assert (config.model.mixer, config.data.seq_len, config.data.num_kv_pairs, config.train.learning_rate,
          config.data.noise) == ("kda", 64, 8, 1e-2, False)
  assert demo.model.mixer == "gdn2"  # apply copies
  seeded = sweep.seeded(config, 2)
  assert (seeded.seed, seeded.data.seed) == (config.seed + 2, config.data.seed + 2)
  assert sweep.expand([]) == [{}] and sweep.point_names([{}]) == ["."]
  tuple_axis = sweep.parse_grid("data.key_range=(1, 30)|(1, 20)", demo)[0]
  assert tuple_axis.values == (((1, 30),), ((1, 20),))
  assert sweep.point_names(sweep.expand([tuple_axis])) == ["key_range-1-30", "key_range-1-20"]


@pytest.mark.parametrize("grid, message", [
    ("model.mixr=gdn", "model has no field 'mixr' (did you mean 'mixer'?)"),
    ("modle.mixer=gdn", "config has no field 'modle' (did you mean 'model'?)"),
    ("data.seq_len=32|abc", "data.seq_len='abc': expected an integer"),
    ("train.learning_rate=fast", "expected a number"),
    ("data.noise=maybe", "expected true or false"),
    ("model=gdn", "a section, not a field"),
    ("model.mixer", "expected 'field=v1|v2|...'"),
    ("model.mixer=gdn|gdn", "distinct non-empty values"),
    ("data.seq_len,data.num_kv_pairs=32", "expected 2 comma-separated values"),
    ("data.seq_len=32;data.seq_len=64", "on two axes"),
    ("variant=demo", "'variant' is an axis of its own, and only of --grid"),
])
def test_bad_grids_name_the_axis(demo, grid, message):
  with pytest.raises(ConfigError, match=re.escape(message)):
    sweep.parse_grid(grid, demo)


def test_variant_axis_reloads_the_config_file_with_the_overrides():
  point_config, variant = sweep.point_configs(mqar_configs.get_config("gdn"), "experiments/configs/mqar.py:gdn",
                                              {"train.steps": 7})
  axes = sweep.parse_grid("variant=kda|demo;data.seq_len=64", mqar_configs.get_config("gdn"), variants=variant)
  configs = [point_config(point) for point in sweep.expand(axes)]
  assert [c.model.mixer for c in configs] == ["kda", "gdn2"]
  assert [c.train.steps for c in configs] == [7, 7] and [c.data.seq_len for c in configs] == [64, 64]
  with pytest.raises(ConfigError, match="variant=kdb.*did you mean 'kda'"):
    sweep.parse_grid("variant=kdb", mqar_configs.get_config("gdn"), variants=variant)


def _fake_runner(calls, eval_metrics=None):
  """Trains nothing: writes the final checkpoint's directory and the evaluations a real run would."""
  def train(config, run_dir, log):
    calls.append(str(run_dir))
    (run_dir / "checkpoints" / str(config.train.steps)).mkdir(parents=True)
    (run_dir / "config.json").write_text(config.to_json())

  def evaluate(model, config):
    return {"loss": 1.0, "accuracy": (eval_metrics or {}).get(config.data.seq_len, 0.5), "exact_match": 0.25}
  return lambda run_dir, log: sweep.run_one(run_dir, log=log, train_fn=train, evaluate_fn=evaluate)


def test_finished_runs_are_skipped_and_interrupted_ones_resume(demo, tmp_path):
  axes = sweep.parse_grid("model.mixer=gdn|kda", demo)
  eval_axes = sweep.parse_grid("data.seq_len=32|64", demo)
  runs = sweep.plan(lambda point: sweep.apply(demo, point), axes, [0, 1], tmp_path, eval_axes)
  assert [run.name for run in runs] == ["mixer-gdn/seed_0", "mixer-gdn/seed_1", "mixer-kda/seed_0",
                                        "mixer-kda/seed_1"]
  assert runs[1].directory == tmp_path / "mixer-gdn" / "seed_1" and runs[1].config.seed == demo.seed + 1
  # gdn/seed_1 was interrupted at step 2 of 4; kda/seed_0 trained to the end but its evaluation at 64 is missing.
  (runs[1].directory / "checkpoints" / "2").mkdir(parents=True)
  (runs[1].directory / "config.json").write_text("{}")
  assert sweep.status(runs[1].directory, 4) == "partial" and sweep.status(runs[0].directory, 4) == "new"
  sweep.prepare(runs[2])
  (runs[2].directory / "checkpoints" / "4").mkdir(parents=True)
  (runs[2].directory / sweep.EVAL).write_text(json.dumps({"step": 4, "loss": 1.0, "accuracy": 0.5,
                                                          "exact_match": 0.25}))
  (runs[2].directory / sweep.EVAL_POINTS).write_text(json.dumps([{"point": {"data.seq_len": 32}, "step": 4,
                                                                  "accuracy": 0.5}]))
  assert sweep.status(runs[2].directory, 4, runs[2].eval_points) == "partial"
  calls, lines = [], []
  outcomes = sweep.run_sweep(runs, runner=_fake_runner(calls), log=lines.append)
  assert outcomes == {run.name: "done" for run in runs}
  # The finished training of kda/seed_0 is not run again; gdn/seed_1 trains (from its checkpoint, in train()).
  assert calls == [str(runs[0].directory), str(runs[1].directory), str(runs[3].directory)]
  evaluated = json.loads((runs[2].directory / sweep.EVAL_POINTS).read_text())
  assert [entry["point"] for entry in evaluated] == [{"data.seq_len": 32}, {"data.seq_len": 64}]
  assert all(sweep.status(run.directory, 4, run.eval_points) == "done" for run in runs)
  assert any("[2/4] mixer-gdn/seed_1: resuming" in line for line in lines)
  calls.clear()
  # A finished run's results without its checkpoints (copied back from another machine) are still done.
  shutil.rmtree(runs[0].directory / "checkpoints")
  assert set(sweep.run_sweep(runs, runner=_fake_runner(calls), log=lines.append).values()) == {"skipped"}
  assert calls == []
  # An evaluation written for another number of steps is not this run's: evaluated again.
  entries = json.loads((runs[3].directory / sweep.EVAL_POINTS).read_text())
  (runs[3].directory / sweep.EVAL_POINTS).write_text(json.dumps([{**entries[0], "step": 2}, *entries[1:]]))
  assert sweep.status(runs[3].directory, 4, runs[3].eval_points) == "partial"
  sweep.run_sweep(runs[3:], runner=_fake_runner(calls), log=lines.append)
  assert calls == [] and sweep.status(runs[3].directory, 4, runs[3].eval_points) == "done"
  assert [entry["step"] for entry in json.loads((runs[3].directory / sweep.EVAL_POINTS).read_text())] == [4, 4]


def test_shards_split_one_sweep_between_processes(demo, tmp_path):
  calls, lines = [], []
  for index in (1, 0):
    sweep.sweep(demo, config_file="experiments/configs/mqar.py:demo", overrides={}, grid="model.mixer=gdn|kda",
                eval_grid="", seeds=[0, 1], workdir=tmp_path, runner=_fake_runner(calls), shard=(index, 2),
                log=lines.append)
  names = ["mixer-gdn/seed_0", "mixer-gdn/seed_1", "mixer-kda/seed_0", "mixer-kda/seed_1"]
  # Shard 1 takes the planned runs 1 and 3, shard 0 the runs 0 and 2: each run once.
  assert calls == [str(tmp_path / name) for name in (names[1], names[3], names[0], names[2])]
  assert "sweep: shard 1/2: 2 of the 4 run(s)" in lines
  assert json.loads((tmp_path / sweep.SWEEP).read_text())["runs"] == names  # the whole sweep, from either shard
  summary = json.loads((tmp_path / "summary.json").read_text())  # the last shard's summary has every run
  assert len(summary["runs"]) == 4
  for text in ("2/2", "1", "a/b", "0/0", "-1/2", "0/1/2"):
    with pytest.raises(ValueError, match="--shard"):
      sweep.parse_shard(text)
  assert sweep.parse_shard("2/3") == (2, 3)


def test_shards_writing_the_sweep_file_at_once_do_not_collide(tmp_path):
  # The shards of one sweep write sweep.json at the same moment; with one shared temporary name one writer's rename
  # took the other's file away (FileNotFoundError on an H100).
  path, errors = tmp_path / sweep.SWEEP, []

  def writer(index):
    try:
      for i in range(50):
        sweep._write_json(path, {"writer": index, "i": i})
    except OSError as error:
      errors.append(error)

  threads = [threading.Thread(target=writer, args=(index,)) for index in range(8)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors
  assert json.loads(path.read_text())["i"] == 49
  assert [p.name for p in tmp_path.iterdir()] == [sweep.SWEEP]  # no temporary file left


def test_a_failed_run_costs_only_itself(demo, tmp_path):
  runs = sweep.plan(lambda point: sweep.apply(demo, point), sweep.parse_grid("model.mixer=gdn|kda", demo), [0],
                    tmp_path)
  def runner(run_dir, log):
    if "gdn" in str(run_dir):
      raise RuntimeError("exit 1: out of memory")
    _fake_runner([])(run_dir, log)
  outcomes = sweep.run_sweep(runs, runner=runner, log=lambda line: None)
  assert outcomes["mixer-gdn/seed_0"].startswith("failed: RuntimeError: exit 1: out of memory")
  assert outcomes["mixer-kda/seed_0"] == "done"


def test_t_interval_against_a_hand_value():
  mean, half = sweep_summary.t_interval([0.5, 0.7, 0.9])
  # t_{0.975, 2} = 4.302653; s = 0.2; half-width = 4.302653 * 0.2 / sqrt(3)
  assert mean == pytest.approx(0.7) and half == pytest.approx(4.302653 * 0.2 / math.sqrt(3), rel=1e-6)
  assert sweep_summary.t_interval([0.3]) == (0.3, None)
  assert sweep_summary.t_interval([0.4, 0.4])[1] == 0.0


def test_summary_merges_workdirs_and_writes_table_json_and_plots(demo, tmp_path):
  eval_axes = sweep.parse_grid("data.seq_len=32|64", demo)
  accuracies = {32: 0.5, 64: 0.75}
  for workdir, seeds in (("a", [0, 1]), ("b", [2])):
    runs = sweep.plan(lambda point: sweep.apply(demo, point),
                      sweep.parse_grid("model.mixer=gdn|kda;model.head_dim,model.value_dim=16,16|32,32", demo), seeds,
                      tmp_path / workdir,
                      eval_axes)
    sweep.run_sweep(runs, runner=_fake_runner([], {32: 0.5 + 0.1 * seeds[0], 64: 0.75}), log=lambda line: None)
  lines = []
  points = sweep_summary.summarize([tmp_path / "a", tmp_path / "b"], tmp_path / "out" / "summary",
                                   log=lines.append)
  assert len(points) == 4 * 3  # (mixer, head size) x (training config, seq_len 32, seq_len 64)
  at_32 = [p for p in points if p["eval_point"] == {"data.seq_len": 32}
           and p["point"] == {"model.mixer": "gdn", "model.head_dim": 32, "model.value_dim": 32}][0]
  assert at_32["seeds"] == [0, 1, 2]
  assert at_32["accuracy"]["values"] == [0.5, 0.5, 0.7]
  assert at_32["accuracy"]["ci"] == pytest.approx(sweep_summary.t_interval([0.5, 0.5, 0.7])[1])
  assert at_32["label"] == "gdn" and at_32["state_elements"] == 2 * 2 * 32 * 32  # 2 layers of H=2, K=V=32
  assert accuracies[64] == [p for p in points if p["eval_point"] == {"data.seq_len": 64}][0]["accuracy"]["mean"]
  for suffix in (".json", ".md", "_head_dim.png", "_seq_len.png", "_state_elements.png"):
    assert (tmp_path / "out" / f"summary{suffix}").stat().st_size > 0
  # value_dim moves with head_dim (one axis of fields set together): one plot, and no line per value_dim.
  assert not (tmp_path / "out" / "summary_value_dim.png").exists()
  assert sweep_summary.plot_axes(points) == [("point", "model.head_dim"), ("eval_point", "data.seq_len"),
                                             (None, "state_elements")]
  assert sorted(sweep_summary._lines(points, "eval_point", "data.seq_len")) == [
      "gdn (head_dim=16, value_dim=16)", "gdn (head_dim=32, value_dim=32)", "kda (head_dim=16, value_dim=16)",
      "kda (head_dim=32, value_dim=32)"]
  by_head = sweep_summary._lines(points, "point", "model.head_dim")
  assert sorted(by_head) == ["gdn", "gdn (seq_len=32)", "gdn (seq_len=64)", "kda", "kda (seq_len=32)",
                             "kda (seq_len=64)"]
  assert [x for x, _ in by_head["gdn (seq_len=32)"]] == [16, 32]
  table = (tmp_path / "out" / "summary.md").read_text()
  assert "| gdn | gdn | 32 | 32 | 32 |" in table and "0.5667 ± 0.2868 | 0.500 (0), 0.500 (1), 0.700 (2) |" in table
  stored = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert len(stored["runs"]) == 4 * 3 * 3
  # An earlier summary's .json stands for its runs once their directories are gone: the same points come back.
  sweep_summary.summarize([tmp_path / "a"], tmp_path / "a_summary", log=lines.append)
  shutil.rmtree(tmp_path / "a")
  merged = sweep_summary.summarize([tmp_path / "a_summary.json", tmp_path / "b"], tmp_path / "merged", log=lines.append)
  assert _by_key(merged) == _by_key(points)
  # A run found twice counts once; a file that is not a summary is a clear error.
  again = sweep_summary.summarize([tmp_path / "merged.json", tmp_path / "b"], tmp_path / "again", log=lines.append)
  assert _by_key(again) == _by_key(points) and any("already found" in line for line in lines)
  (tmp_path / "bad.json").write_text("[1, 2]")
  with pytest.raises(ValueError, match="not a sweep summary"):
    sweep_summary.summarize([tmp_path / "bad.json"], tmp_path / "bad", log=lines.append)


def _by_key(points):
  return {json.dumps([p["point"], p["eval_point"]], sort_keys=True): (p["seeds"], p["accuracy"]) for p in points}


def test_mixer_labels():
  model = ml_collections.ConfigDict({"mixer": "gdn2", "pattern": "SSSM", "num_layers": 4})
  assert sweep_summary.mixer_label(model) == "swa+sdm"
  assert sweep_summary.mixer_label({"mixer": "kda", "pattern": "DDDA", "num_layers": 4}) == "kda+attention"
