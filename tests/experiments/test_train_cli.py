"""The programs from the command line (issue 22): a bad flag, config file or field is one line on stderr naming
it, exit code 2, nothing written; Ctrl-C stops a real training process at a step boundary (exit 130, no
traceback, the plot written) and the resumed run logs each step once; generate refuses prompts outside the
vocabulary and prints a byte-level run's text."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from experiments import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
MQAR = str(ROOT / "experiments" / "configs" / "mqar.py")
# A 1-layer width-32 attention model on 4 sequences of 32 tokens: each step takes milliseconds.
TINY = ["--config.model.pattern=A", "--config.model.width=32", "--config.model.num_layers=1",
        "--config.data.batch_size=4", "--config.train.log_every=1", "--config.train.eval_every=100000"]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def program(name, *args):
  return [sys.executable, "-m", f"experiments.{name}", *args]


@pytest.mark.parametrize("args, line", [
    ([f"--config={MQAR}:demo", "--config.model.widht=3"],
     "error: --config.model.widht: config.model has no field 'widht' (did you mean 'width'?)"),
    ([f"--config={MQAR}:demo", "--config.trian.steps=3"],
     "error: --config.trian.steps: config has no field 'trian' (did you mean 'train'?)"),
    ([f"--config={MQAR}:gdn3"], f"error: --config={MQAR}:gdn3: config variant: expected one of ('gdn', 'kda', "
     "'fg2_gdn', 'fg2_gdn_plus', 'gdn2', 'gdn2_swa', 'fg2_attn', 'sdm', 'demo', 'cpu'), got 'gdn3' (did you mean "
     "'gdn' or 'gdn2'?)"),
    ([f"--config={MQAR[:-3]}s.py:demo"],
     f"error: --config={MQAR[:-3]}s.py:demo: cannot load that config file; expected path/to/config.py:variant"),
    ([f"--config={MQAR}:demo", "--workdri=x"], "error: Unknown command line flag 'workdri'. Did you mean: workdir ?"),
])
def test_a_bad_flag_or_config_field_is_one_line_and_exit_code_2(args, line, capsys, monkeypatch):
  monkeypatch.setattr(sys, "argv", ["train", *args])  # config_flags reads its overrides from sys.argv
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=False)
  flags.DEFINE_string("workdir", None, "", flag_values=flag_values)
  with pytest.raises(SystemExit) as exit_:
    cli.parse_flags(sys.argv, flag_values)
  assert exit_.value.code == 2
  assert capsys.readouterr().err == line + "\n"


def test_a_train_call_that_fails_its_checks_exits_2_and_writes_nothing(tmp_path):
  for args, start in (([], "error: --config: expected path/to/config.py:variant (or a --workdir holding a run)"),
                      ([f"--config={MQAR}:demo", "--config.model.impl=trition"], "error: config.model.impl: ")):
    out = subprocess.run(program("train", f"--workdir={tmp_path / 'run'}", *args), cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.startswith(start) and out.stderr.count("\n") == 1, out.stderr
  assert not (tmp_path / "run").exists()


def test_ctrl_c_stops_at_a_step_boundary_and_the_resumed_run_logs_each_step_once(tmp_path):
  args = program("train", f"--config={MQAR}:demo", f"--workdir={tmp_path}", *TINY, "--config.train.steps=100000",
                 "--config.train.checkpoint_every=100000")
  process = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  for line in process.stdout:
    if line.startswith("step 3/"):
      process.send_signal(signal.SIGINT)
      break
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 130, stderr
  assert "Traceback" not in stderr and "Fatal" not in stderr and "terminate called" not in stderr
  assert "stopped by SIGINT at step" in stderr and "Resume with:" in stderr
  assert (tmp_path / "metrics.png").stat().st_size > 0
  stopped = int(stderr.split("stopped by SIGINT at step ")[1].split(";")[0])
  resumed = subprocess.run(args + ["--stop_after=2"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr
  assert f"resumed from step {stopped}" in resumed.stdout
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == list(range(1, stopped + 3))


def test_generate_prints_a_byte_level_runs_text_and_refuses_ids_outside_the_vocabulary(tmp_path):
  from experiments.configs.text import get_config
  from sdm_jax.training import loop
  config = get_config("gdn2")
  config.data.seq_len, config.data.batch_size, config.data.max_bytes = 32, 4, 20_000
  config.model.pattern, config.model.width, config.model.num_layers = "A", 32, 1
  config.train.steps = config.train.checkpoint_every = config.train.eval_batches = 1
  loop.train(config, tmp_path, log=lambda _: None)
  out = subprocess.run(program("generate", f"--workdir={tmp_path}", "--prompt_tokens=1,256"), cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 2, out.stderr
  assert out.stderr == ("error: --prompt_tokens: token ids must lie in [0, 256) (the vocabulary), got values in "
                        "[1, 256]\n")
  out = subprocess.run(program("generate", f"--workdir={tmp_path}", "--prompt=def ", "--max_new_tokens=6"),
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  ids, text = out.stdout.split("\n", 1)
  ids = [int(i) for i in ids.split()]
  assert len(ids) == 6 and text == bytes(ids).decode("utf-8", "replace") + "\n"
