"""Every tool as a newcomer meets it (issue 52): `--help` exits 0 from any directory; a bad or damaged path is one
line on stderr naming it, exit code 2, no traceback; a config whose fields conflict (num_queries over num_kv_pairs)
is refused before any run starts, by train and by a sweep's dry run; a benchmark whose entries fail exits 3 after
writing its report. Each case runs the real program in a process of its own, from a directory other than the
repository's."""

import json
import os
import pathlib
import subprocess
import sys

from experiments import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
MQAR = str(ROOT / "experiments" / "configs" / "mqar.py")
CORPUS = str(ROOT / "experiments" / "configs" / "corpus.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
TOOLS = sorted(path.stem for path in (ROOT / "experiments").glob("*.py") if "flags.DEFINE" in path.read_text())


def run(tool, *args, cwd):
  return subprocess.run([sys.executable, "-m", f"experiments.{tool}", *map(str, args)], cwd=cwd, env=ENV,
                        capture_output=True, text=True, timeout=300)


def assert_one_line(done, *needles):
  assert done.returncode == cli.USAGE_EXIT, done.stdout[-2000:] + done.stderr[-2000:]
  assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr[-2000:]
  for needle in needles:
    assert needle in done.stderr, done.stderr


def test_every_tool_prints_its_help_and_exits_0_from_any_directory(tmp_path):
  assert {"train", "eval", "generate", "sweep", "bench", "prepare_data", "summarize_runs", "compare_impls"} <= set(
      TOOLS)
  for tool in TOOLS:
    done = run(tool, "--help", cwd=tmp_path)
    assert done.returncode == 0, f"{tool}: {done.stderr[-2000:]}"
    assert "python -m experiments." in done.stdout and "--" in done.stdout, f"{tool}: {done.stdout[:500]}"


def test_bad_and_damaged_paths_are_one_line_and_exit_2(tmp_path):
  missing = tmp_path / "missing"
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory")
  damaged_run = tmp_path / "damaged_run"
  damaged_run.mkdir()
  (damaged_run / "config.json").write_text('{"model": ')
  (damaged_run / "metrics.jsonl").write_text('{"split": "train", "step": 1, "loss"\n')
  empty_run = tmp_path / "empty_run"
  empty_run.mkdir()
  not_json = tmp_path / "report.json"
  not_json.write_text("no report")
  (tmp_path / "inputs").mkdir()
  (tmp_path / "inputs" / "empty.txt").write_text("")
  cases = [
      ("train", [f"--config={MQAR}:cpu", f"--workdir={a_file}"], ["workdir:", "is a file"]),
      ("train", [f"--config={CORPUS}:cpu,{missing}", f"--workdir={tmp_path / 'run'}"],
       ["config.data: corpus directory", "has no manifest.json"]),
      ("eval", [f"--workdir={missing}"], [f"{missing / 'config.json'} does not exist"]),
      ("eval", [f"--workdir={damaged_run}"], [f"{damaged_run / 'config.json'} is damaged"]),
      ("generate", [f"--workdir={missing}", "--prompt_tokens=1"], ["workdir:", "does not exist"]),
      ("summarize_runs", [f"--workdirs={missing}"], [f"{str(missing)!r} is not a directory"]),
      ("summarize_runs", [f"--workdirs={empty_run}"], ["metrics.jsonl"]),
      ("summarize_runs", [f"--workdirs={damaged_run}"], [f"{str(damaged_run / 'metrics.jsonl')!r} is damaged"]),
      ("sweep", ["--summarize_only", f"--workdir={missing}"], [f"{str(missing)!r} is not a directory"]),
      ("sweep", ["--summarize_only", f"--workdir={not_json}"], [f"{str(not_json)!r} is not a sweep summary"]),
      ("bench", ["--what=ops", f"--merge={missing}.json"], [f"merge: '{missing}.json'", "FileNotFoundError"]),
      ("bench", ["--what=ops", f"--merge={not_json}"], [f"merge: '{not_json}'", "expected the JSON report"]),
      ("prepare_data", [f"--inputs={missing}/*.txt", f"--out={tmp_path / 'corpus'}"], ["matches no file"]),
      ("prepare_data", [f"--inputs={tmp_path / 'inputs'}/*.txt", f"--out={tmp_path / 'corpus'}"], ["are empty"]),
      ("prepare_data", [f"--inputs={tmp_path / 'inputs'}/*.txt", f"--out={a_file}"], ["is a file"]),
      ("compare_impls", [f"--out_json={missing}/report.json"], ["--out_json=", "its directory does not exist"]),
  ]
  for tool, args, needles in cases:
    assert_one_line(run(tool, *args, cwd=tmp_path), *needles)
  assert not (tmp_path / "corpus").exists() and not (tmp_path / "run").exists()


def test_conflicting_fields_are_refused_before_anything_runs(tmp_path):
  line = "config.data.num_queries: expected 1 <= num_queries <= num_kv_pairs = 2, got 4"
  assert_one_line(run("train", f"--config={MQAR}:cpu", "--config.data.num_kv_pairs=2", f"--workdir={tmp_path / 'r'}",
                      cwd=tmp_path), line)
  # Every grid point is checked before the dry run lists the runs: the README's first example once set 8 pairs
  # and left 16 queries, which half its points met only when they started.
  done = run("sweep", f"--config={MQAR}:cpu", "--grid=data.num_kv_pairs=4|2", "--dry_run",
             f"--workdir={tmp_path / 's'}", cwd=tmp_path)
  assert_one_line(done, f"grid point num_kv_pairs-2: {line}")
  assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()


def test_a_benchmark_whose_entries_fail_writes_its_report_and_exits_3(tmp_path):
  from sdm_jax.benchmarking.trees import FAILED_ENTRIES_EXIT
  done = run("bench", "--what=train", f"--set=configs={MQAR}:cpu", "--set=timeout=1", "--set=peers=",
             f"--out_dir={tmp_path}", cwd=tmp_path)
  assert done.returncode == FAILED_ENTRIES_EXIT, done.stdout[-2000:] + done.stderr[-2000:]
  assert "timed out after 1 s" in done.stderr and done.stderr.count("\n") == 1
  report = json.loads(next(tmp_path.glob("*_train.json")).read_text())
  assert [entry["error"] for entry in report["results"]] == ["timed out after 1 s"]


def test_a_relative_corpus_directory_is_stored_absolute(tmp_path, monkeypatch):
  """A run's config.json and a sweep's run configs, sweep.json and summary name their paths wherever they are read
  from (a corpus run once stored its data directory as given, relative to where it was started)."""
  from sdm_jax.data import prepare
  from sdm_jax.training import sweep
  prepare.prepare("pydoc", "train:300", tmp_path / "data" / "pydoc", log=lambda _: None)
  # An attention layer instead of the config's GDN-2: the stored path does not depend on the model, and its training
  # step compiles in a fraction of the time.
  done = run("train", f"--config={CORPUS}:cpu,data/pydoc", "--workdir=run", "--config.train.steps=1",
             "--config.data.seq_len=16", "--config.data.batch_size=2", "--config.train.eval_batches=1",
             "--config.model.pattern=A", cwd=tmp_path)
  assert done.returncode == 0, done.stderr[-2000:]
  assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["data_dir"] == str(
      tmp_path / "data" / "pydoc")
  monkeypatch.chdir(tmp_path)
  config = sweep.load_config_file(f"{CORPUS}:cpu,data/pydoc")
  runs = sweep.plan(lambda point: config, [], [0], "sweep")
  assert runs[0].directory == tmp_path / "sweep" / "seed_0"
  assert runs[0].config.data.data_dir == str(tmp_path / "data" / "pydoc")
  assert sweep.describe(runs, "cfg.py:cpu", "", "", [0])["config"] == f"{tmp_path / 'cfg.py'}:cpu"
