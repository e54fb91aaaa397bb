"""experiments.train --print_config: the resolved config (the variant with its --config.* overrides) as JSON on
stdout, exit code 0, nothing trained or written; without it --workdir is required."""

import json
import os
import pathlib
import subprocess
import sys

from experiments.configs.mqar import get_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
MQAR = str(ROOT / "experiments" / "configs" / "mqar.py")
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def train(*args, cwd):
  return subprocess.run([sys.executable, "-m", "experiments.train", *args], cwd=cwd,
                        env={**ENV, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)


def test_print_config_prints_the_resolved_config_and_trains_nothing(tmp_path):
  out = train(f"--config={MQAR}:demo", "--config.train.steps=7", "--config.train.schedule=wsd",
              f"--workdir={tmp_path / 'run'}", "--print_config", cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  expected = get_config("demo")
  expected.train.steps, expected.train.schedule = 7, "wsd"
  assert json.loads(out.stdout) == json.loads(expected.to_json_best_effort())
  assert list(tmp_path.iterdir()) == []  # no workdir, nothing else


def test_print_config_needs_no_workdir_and_training_does(tmp_path):
  assert train(f"--config={MQAR}:demo", "--print_config", cwd=tmp_path).returncode == 0
  out = train(f"--config={MQAR}:demo", cwd=tmp_path)
  assert out.returncode == 2
  assert out.stderr == "error: --workdir: expected the run directory (a path), got none\n"
