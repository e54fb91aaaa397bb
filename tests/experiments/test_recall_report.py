"""The recall protocol's report on sweeps of recall.py's variants whose training is scripted (no model trained): the
pilot picks each model's rate and writes them, the outcomes at those rates decide a claim by its success counts,
the sanity check names full attention's settings, the output-gate presets are told apart; the protocol script's
CPU dry run (slow) goes through a pilot, a piece and its report."""

import json
import os
import pathlib
import subprocess

import pytest

from experiments import recall_protocol
from experiments.configs import recall
from sdm_jax.training import sweep, sweep_stats
from sdm_jax.training.metrics import MetricsLog

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = "experiments/configs/recall.py:mqar_gdn"
POINT = "data.seq_len,data.num_kv_pairs,data.num_queries=256,64,64"


def scripted(accuracy_of):
  """A sweep runner that trains nothing: accuracy_of(point name, seed) is the run's accuracy; a run at or above 0.99
  reaches it at step 1000 (its evaluation curve and final checkpoint say so), any other trains all its steps."""
  def run(run_dir, log):
    accuracy = accuracy_of(run_dir.parent.name, int(run_dir.name.split("_")[1]))

    def train(config, workdir, log):
      stop = 1000 if accuracy >= config.train.stop_at_accuracy else config.train.steps
      records = MetricsLog(workdir)
      for step in range(500, stop + 1, 500):
        records.write({"split": "eval", "step": step, "accuracy": accuracy if step == stop else accuracy / 2})
      (workdir / "checkpoints" / str(stop)).mkdir(parents=True)
      (workdir / "config.json").write_text(config.to_json())

    def evaluate(model, config):
      return {"loss": 1.0, "accuracy": accuracy, "exact_match": accuracy}
    sweep.run_one(run_dir, log=log, train_fn=train, evaluate_fn=evaluate)
  return run


def run_sweep(workdir, grid, accuracy_of, seeds=5):
  base = recall.get_config("mqar_gdn")
  sweep.sweep(base, config_file=CONFIG, overrides={}, grid=grid, eval_grid="data.min_kv_pairs=0", seeds=range(seeds),
              workdir=workdir, runner=scripted(accuracy_of), log=lambda line: None)


def study(name, seed):
  """GDN-2 at 0.01 learns in every seed, at 0.001 in none; KDA at 0.001 in seed 0 only, at 0.01 in none; attention
  at 0.003 in every seed."""
  if "attention" in name:
    return 1.0
  if "gdn2" in name:
    return 0.995 if "lr0.01_" in name else 0.02
  return 0.95 if "lr0.001_" in name and seed == 0 else 0.01


def test_pilot_then_outcomes_decide_a_claim(tmp_path):
  variants = recall.protocol_variants("mqar", "gdn2 kda", "128", rates="0.001 0.01")
  run_sweep(tmp_path / "mqar", f"variant={variants}|mqar_attention_w128_lr0.003;{POINT}", study)
  lines = []
  pilot = recall_protocol.report("lr_pilot", [tmp_path / "mqar"], tmp_path / "pilot", log=lines.append)
  rates = json.loads((tmp_path / "pilot_rates.json").read_text())
  assert rates == {"mqar": {"attention": 0.003, "gdn2": 0.01, "kda": 0.001}}
  assert "| gdn2 | 0.01 | 5 / 5 | 0.995 | 1000 | **yes** |" in pilot
  assert "| kda | 0.001 | 1 / 5 | 0.198 | 4000 | **yes** |" in pilot  # no seed reached 0.99: the whole budget
  assert (tmp_path / "pilot_curves.png").stat().st_size > 0
  text = recall_protocol.report("outcomes", [tmp_path / "mqar"], tmp_path / "outcomes",
                              rates=tmp_path / "pilot_rates.json", log=lines.append)
  # GDN-2 5 of 5 against KDA 1 of 5: Fisher's one-sided p = 6 / 252; GDN-2 > GDN was not run.
  assert "| gdn2 > kda | task mqar width 128 seq_len 256 pairs 64 head_dim 64 | 5/5 | 1/5 | successes | 0.024 | - |" \
      in text
  assert "|  | gdn2 > kda | holds |" in text and "| **the claim** | **partly** |" in text
  assert "|  | gdn2 > gdn | not run |" in text and "sanity: passed" in text  # attention ran beside them
  assert "0.001" not in text.split("| gdn2 |")[1].split("\n")[0]  # GDN-2 at its picked rate only
  sanity = recall_protocol.report("sanity", [tmp_path / "mqar"], tmp_path / "sanity", log=lines.append)
  assert "| task mqar width 128 seq_len 256 pairs 64 head_dim 64 | 0.003 |" in sanity and "sanity: passed" in sanity


def test_gate_presets_are_compared(tmp_path):
  accuracy = lambda name, seed: 0.995 if "preset-fla" in name else 0.0
  run_sweep(tmp_path / "gates", f"variant=mqar_gdn2_w128_lr0.003;model.delta.preset=fla|official;{POINT}", accuracy,
            seeds=4)
  text = recall_protocol.report("gate_ablation", [tmp_path / "gates"], tmp_path / "gates_report", log=lambda _: None)
  assert "| gdn2/fla > gdn2/official | task mqar width 128 seq_len 256 pairs 64 head_dim 64 | 4/4 | 0/4 | " in text
  assert f"| {sweep_stats.HOLDS} |" in text


def test_reports_refuse_what_they_cannot_read(tmp_path):
  with pytest.raises(ValueError, match="is not a directory"):
    recall_protocol.report("outcomes", [tmp_path / "missing"], tmp_path / "out", log=lambda _: None)
  run_sweep(tmp_path / "mqar", f"variant=mqar_kda_w128_lr0.003;{POINT}", lambda name, seed: 0.5, seeds=1)
  with pytest.raises(ValueError, match="rates: expected a pilot's <out>_rates.json"):
    recall_protocol.report("outcomes", [tmp_path / "mqar"], tmp_path / "out", rates=tmp_path / "none.json",
                         log=lambda _: None)


@pytest.mark.slow
def test_protocol_script_dry_run(tmp_path):
  env = {**os.environ, "DRY_RUN": "1", "RES": str(tmp_path / "runs"), "OUT": str(tmp_path / "out"),
         "PY": str(ROOT / ".venv" / "bin" / "python")}
  bad = subprocess.run(["bash", "benchmarks/recall/protocol.sh", "nonsense"], cwd=ROOT, env=env, capture_output=True,
                       text=True)
  assert bad.returncode == 2 and bad.stderr.startswith("protocol.sh: expected a piece, one of: sanity")
  no_rates = subprocess.run(["bash", "benchmarks/recall/protocol.sh", "mqar_pressure"], cwd=ROOT, env=env,
                            capture_output=True, text=True)
  assert no_rates.returncode == 2 and "no pilot rates" in no_rates.stderr
  for piece in ("lr_pilot", "mqar_pressure"):
    done = subprocess.run(["bash", "benchmarks/recall/protocol.sh", piece], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  assert "| gdn2 > kda | task mqar width 64 seq_len 128 pairs 16 head_dim 64 | 0/2 | 0/2 | neither |" in done.stdout
  assert (tmp_path / "out" / "report_mqar_pressure.md").exists() and (tmp_path / "out" / "recall_protocol.tgz").exists()
