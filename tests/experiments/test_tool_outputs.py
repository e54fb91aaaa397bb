"""Where the tools write and what (issue 22): the README's commands run with the interpreter it sets up; the
report tools write outside the tracked tree by default; the JSON the programs write is JSON (a non-finite number
is null, not the bare NaN that json.dumps writes)."""

import json
import math
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

from sdm_jax import jsonio
from sdm_jax.benchmarking.tables import write_tables
from sdm_jax.training.metrics import MetricsLog

ROOT = pathlib.Path(__file__).resolve().parents[2]


def strict_json(text):
  def refuse(constant):
    raise AssertionError(f"not JSON: {constant}")
  return json.loads(text, parse_constant=refuse)


def test_the_readme_commands_use_the_venv_interpreter():
  commands = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()
              if line.startswith("    ") and re.search(r"\bpython\S* -m ", line)]
  assert len(commands) >= 10
  assert [c for c in commands if not c.startswith(".venv/bin/python -m ")] == []


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
def test_the_report_tools_write_outside_the_tracked_tree_by_default():
  defaults = {}
  for path in sorted((ROOT / "experiments").glob("*.py")):
    found = re.search(r'DEFINE_string\("out_dir", "([^"]+)"', path.read_text())
    if found:
      defaults[path.stem] = found.group(1)
  assert "bench" in defaults
  for tool, out_dir in defaults.items():
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{out_dir}/2026-01-01_{tool}.json"], cwd=ROOT)
    assert ignored.returncode == 0, f"{tool}: --out_dir={out_dir} is tracked"


def test_json_outputs_write_non_finite_numbers_as_null(tmp_path):
  assert strict_json(jsonio.dumps({"loss": np.float32(np.nan), "values": [1.5, math.inf], "step": np.int64(3)})) == {
      "loss": None, "values": [1.5, None], "step": 3}
  log = MetricsLog(tmp_path)
  log.write({"split": "eval", "step": 1, "loss": math.nan, "perplexity": math.inf})
  assert strict_json(log.path.read_text()) == {"split": "eval", "step": 1, "loss": None, "perplexity": None}
  paths = write_tables([{"ms": math.nan}], {"date": "2026-12-01T00:00:00", "config": {}}, tmp_path, "t", "T", [], "")
  assert strict_json(pathlib.Path(paths["json"]).read_text())["results"] == [{"ms": None}]


def test_no_test_imports_a_command_line_tool():
  """absl flags are global: two tools that define one flag name, imported into one pytest worker, raise
  DuplicateFlagError (a CI failure). Tests call the libraries, and the tools only in subprocesses."""
  tools = {path.stem for path in (ROOT / "experiments").glob("*.py") if "flags.DEFINE" in path.read_text()}
  assert {"train", "bench", "prepare_data"} <= tools
  pattern = re.compile(r"^\s*(?:from experiments import ([\w, ]+)|(?:from|import) experiments\.(\w+))", re.M)
  found = []
  for path in sorted((ROOT / "tests").rglob("*.py")):
    for names, module in pattern.findall(path.read_text()):
      imported = {name.strip() for name in names.split(",")} if names else {module}
      found += [f"{path.relative_to(ROOT)}: experiments.{name}" for name in sorted(imported & tools)]
  assert found == []
