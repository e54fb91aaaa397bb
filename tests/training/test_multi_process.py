"""A run of two processes (jax.distributed over localhost, gloo collectives, 2 CPU devices each, FSDP over all 4),
as on two hosts: every process reads its own rows of the batch, one writes the run's files, orbax writes the
checkpoint from both; then one process of one device resumes it. Its losses are a straight 1-device run's.

Run as a script, this file is one such process: argv = process id, process count, coordinator port, workdir, steps
to train.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS, FIRST = 4, 2  # the two processes train steps 1-2, the one process resumes for 3-4


def _config(fsdp):
  from test_training import attention_config
  config = attention_config(steps=STEPS)
  config.train.checkpoint_every = FIRST
  config.train.fsdp = fsdp
  return config


def _process(process_id, count, port, workdir, steps):
  import jax
  if count > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=count, process_id=process_id)
  from sdm_jax.training import loop
  loop.train(_config(fsdp=count > 1), workdir, stop_after=steps, log=lambda _: None)
  print(json.dumps({"processes": jax.process_count(), "devices": jax.device_count()}), flush=True)


def _run(args, devices, timeout=300):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices),
         "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "training"), str(ROOT / "tests")])}
  return subprocess.Popen([sys.executable, __file__, *map(str, args)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _result(process, timeout=300):
  out, err = process.communicate(timeout=timeout)
  assert process.returncode == 0, err[-3000:]
  return json.loads(out.strip().splitlines()[-1])


def test_two_processes_train_as_one_and_one_process_resumes(tmp_path):
  import portpicker
  from sdm_jax.training import loop
  from sdm_jax.training.metrics import MetricsLog
  port = portpicker.pick_unused_port()
  workdir = tmp_path / "two_hosts"
  pair = [_run([k, 2, port, workdir, FIRST], devices=2) for k in (0, 1)]
  loop.train(_config(fsdp=False), tmp_path / "straight", log=lambda _: None)  # meanwhile, in this process
  assert [_result(p) for p in pair] == [{"processes": 2, "devices": 4}] * 2
  assert sorted(os.listdir(workdir / "checkpoints")) == [str(FIRST)]
  assert _result(_run([0, 1, 0, workdir, STEPS], devices=1)) == {"processes": 1, "devices": 1}

  def losses(path):
    return {r["step"]: r["loss"] for r in MetricsLog(path).read() if r["split"] == "train"}
  # One process wrote the log: each step once.
  assert [r["step"] for r in MetricsLog(workdir).read() if r["split"] == "train"] == list(range(1, STEPS + 1))
  straight, resumed = losses(tmp_path / "straight"), losses(workdir)
  np.testing.assert_allclose([resumed[s] for s in range(1, STEPS + 1)], [straight[s] for s in range(1, STEPS + 1)],
                             rtol=1e-5)


if __name__ == "__main__":
  process_id, count, port, workdir, steps = sys.argv[1:]
  _process(int(process_id), int(count), int(port), pathlib.Path(workdir), int(steps))
