"""A run of two processes (jax.distributed over localhost, gloo collectives, 2 CPU devices each, FSDP over all 4),
as on two hosts: every process reads its own rows of the batch, one writes the run's files, orbax writes the
checkpoint from both. A SIGTERM reaches process 1 alone, at step 2: both stop together at step 4 (the next multiple
of log_every) with a checkpoint there. One process of one device then resumes the run to its end. Its losses are a
straight 1-device run's.

Run as a script, this file is one such process: argv = process id, process count, coordinator port, workdir.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Process 1 is signalled while it logs step 2, after that step's agreement: both stop at the next, step 4.
STEPS, SIGNALLED, STOPPED = 6, 2, 4


def _config(fsdp):
  from training_helpers import attention_config
  config = attention_config(steps=STEPS)
  config.train.log_every, config.train.checkpoint_every = 2, 100
  config.train.fsdp = fsdp
  return config


def _process(process_id, count, port, workdir):
  import jax
  if count > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=count, process_id=process_id)
  from sdm_jax.training import loop

  def log(line):  # the signal, sent from the step's own log line: at a known step, whatever the timing
    if process_id == 1 and line.startswith(f"step {SIGNALLED}/"):
      os.kill(os.getpid(), signal.SIGTERM)

  config = _config(fsdp=count > 1)
  result = {"processes": jax.process_count(), "devices": jax.device_count()}
  try:
    result["step"] = loop.train(config, workdir, log=log)
  except loop.TrainingInterrupted as stopped:
    result.update(interrupted=stopped.signum, step=stopped.step)
  print(json.dumps(result), flush=True)


def _run(args, devices):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices),
         "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "training"), str(ROOT / "tests")])}
  return subprocess.Popen([sys.executable, __file__, *map(str, args)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _result(process, timeout=300):
  try:
    out, err = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:  # a process waiting in a collective the other left: do not leave it behind
    process.kill()
    out, err = process.communicate()
    raise AssertionError(f"no result in {timeout} s (a hang?):\n{err[-3000:]}") from None
  assert process.returncode == 0, err[-3000:]
  return json.loads(out.strip().splitlines()[-1])


def test_two_processes_train_as_one_stop_together_and_one_process_resumes(tmp_path):
  import portpicker
  from sdm_jax.training import loop
  from sdm_jax.training.metrics import MetricsLog
  port = portpicker.pick_unused_port()
  workdir = tmp_path / "two_hosts"
  pair = [_run([k, 2, port, workdir], devices=2) for k in (0, 1)]
  try:
    loop.train(_config(fsdp=False), tmp_path / "straight", log=lambda _: None)  # meanwhile, in this process
    results = [_result(p) for p in pair]
  finally:
    for p in pair:
      p.kill()
  stopped = {"processes": 2, "devices": 4, "interrupted": signal.SIGTERM, "step": STOPPED}
  assert results == [stopped, stopped]
  assert sorted(os.listdir(workdir / "checkpoints")) == [str(STOPPED)]
  assert _result(_run([0, 1, 0, workdir], devices=1)) == {"processes": 1, "devices": 1, "step": STEPS}

  def losses(path):
    return {r["step"]: r["loss"] for r in MetricsLog(path).read() if r["split"] == "train"}
  # One process wrote the log: each logged step once.
  logged = list(range(2, STEPS + 1, 2))
  assert [r["step"] for r in MetricsLog(workdir).read() if r["split"] == "train"] == logged
  straight, resumed = losses(tmp_path / "straight"), losses(workdir)
  np.testing.assert_allclose([resumed[s] for s in logged], [straight[s] for s in logged], rtol=1e-5)


if __name__ == "__main__":
  process_id, count, port, workdir = sys.argv[1:]
  _process(int(process_id), int(count), int(port), pathlib.Path(workdir))
