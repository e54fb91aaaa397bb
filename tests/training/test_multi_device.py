"""One run trained in segments on 1, 4 (FSDP), 2, 4 (FSDP) and 1 forced host devices, each segment resuming the
checkpoint of the one before on its own mesh (restores 1 -> 4, 4 -> 2, 2 -> 4 and 4 -> 1), against a straight
1-device run: the same losses at every step, every restored array in the sharding the reading run placed it in,
and FSDP parameters split over the 4 devices.

Run as a script, this file is a process of one device count (set in its environment) that trains the segments it
is sent, one JSON line in and one out on stdin and stdout. The test keeps one such process per device count, so a
device count's programs compile once and each process imports once; every segment still builds its model afresh
and reads its checkpoint from disk, written by another process on another mesh.
"""

import contextlib
import json
import os
import pathlib
import select
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 10
# (devices, train.fsdp, steps of this segment): each segment after the first resumes the one before it.
SEGMENTS = ((1, False, 2), (4, True, 2), (2, False, 2), (4, True, 2), (1, False, 2))


def segment_config(fsdp):
  from training_helpers import attention_config
  config = attention_config(steps=STEPS)
  config.train.log_every, config.train.checkpoint_every = 1, 2
  config.train.fsdp = fsdp
  return config


def placement(*modules):
  """{"arrays", "sharded": arrays split over the data axis, "devices": the most devices one array spans,
  "param_fraction": the parameters' bytes held by device 0 over their total} of the modules' state."""
  import jax
  from flax import nnx
  arrays = [x for module in modules for x in jax.tree.leaves(nnx.state(module))]
  params = jax.tree.leaves(nnx.state(modules[0], nnx.Param))
  device = jax.devices()[0]
  held = sum(shard.data.nbytes for x in params for shard in x.addressable_shards if shard.device == device)
  return {"arrays": len(arrays), "sharded": sum(not x.sharding.is_fully_replicated for x in arrays),
          "devices": max(len(x.sharding.device_set) for x in arrays),
          "param_fraction": held / sum(x.nbytes for x in params)}


@contextlib.contextmanager
def recording_placements(seen):
  """Within the context, every Checkpointer restore and save appends the step and the placement of model and
  optimizer to seen["restores"] / seen["saves"]; a restore also counts the arrays it left in another sharding
  than the one they had before ("moved")."""
  import jax
  from flax import nnx

  from sdm_jax.training.checkpoint import Checkpointer
  restore, save = Checkpointer.restore, Checkpointer.save

  def recording_restore(self, model, optimizer=None, iterator=None, **kwargs):
    modules = (model,) if optimizer is None else (model, optimizer)
    target = [x.sharding for module in modules for x in jax.tree.leaves(nnx.state(module))]
    step = restore(self, model, optimizer, iterator, **kwargs)
    got = [x for module in modules for x in jax.tree.leaves(nnx.state(module))]
    moved = sum(not x.sharding.is_equivalent_to(s, x.ndim) for x, s in zip(got, target, strict=True))
    seen["restores"].append({"step": step, "moved": moved, **placement(*modules)})
    return step

  def recording_save(self, step, model, optimizer, *args):
    seen["saves"].append({"step": step, **placement(model, optimizer)})
    return save(self, step, model, optimizer, *args)

  Checkpointer.restore, Checkpointer.save = recording_restore, recording_save
  try:
    yield seen
  finally:
    Checkpointer.restore, Checkpointer.save = restore, save


def run_segment(workdir, fsdp, stop_after, reference=None):
  """Trains `stop_after` steps of the run in workdir (and first, given `reference`, the whole run straight there);
  returns the device count, the step reached and the placements of its restore and saves."""
  import jax

  from sdm_jax.training import loop
  if reference is not None:
    config = segment_config(False)
    config.train.checkpoint_every = STEPS  # a save changes no loss; one is enough
    loop.train(config, reference, log=lambda _: None)
  with recording_placements({"devices": len(jax.devices()), "restores": [], "saves": []}) as seen:
    seen["step"] = loop.train(segment_config(fsdp), workdir, stop_after=stop_after, log=lambda _: None)
  return seen


class SegmentProcess:
  """A process of `devices` CPU devices (this file as a script) that trains the segments sent to it; its stderr
  goes to `log`."""

  def __init__(self, devices, log):
    self.devices, self.log = devices, log
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    with log.open("w") as stderr:
      self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=stderr, text=True,
                                      env={**env, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices)})

  def run(self, timeout=300, **segment):
    """run_segment(**segment) in the process; what it returned."""
    self.process.stdin.write(json.dumps(segment) + "\n")
    self.process.stdin.flush()
    ready = select.select([self.process.stdout], [], [], timeout)[0]
    line = self.process.stdout.readline() if ready else ""
    assert line, (f"the {self.devices}-device process gave no result for {segment} within {timeout} s:\n"
                  f"{self.log.read_text()[-3000:]}")
    return json.loads(line)

  def close(self):
    if self.process.poll() is None:
      self.process.stdin.close()
      try:
        self.process.wait(timeout=60)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()


def logged(workdir, split, key):
  """{step: the value of `key`} of a run's records of `split`."""
  from sdm_jax.training.metrics import MetricsLog
  return {r["step"]: r[key] for r in MetricsLog(workdir).read() if r["split"] == split}


def test_a_run_resumes_across_device_counts_and_fsdp_with_the_losses_of_one_device(tmp_path):
  run, reference = tmp_path / "run", tmp_path / "straight"
  processes = {}
  try:
    for devices in dict.fromkeys(devices for devices, _, _ in SEGMENTS):
      processes[devices] = SegmentProcess(devices, tmp_path / f"{devices}_devices.log")
    step = 0
    for index, (devices, fsdp, steps) in enumerate(SEGMENTS):
      seen = processes[devices].run(workdir=str(run), fsdp=fsdp, stop_after=steps,
                                    **({"reference": str(reference)} if index == 0 else {}))
      assert seen["devices"] == devices and seen["step"] == step + steps
      assert [r["step"] for r in seen["restores"]] == [step or None]
      assert [s["step"] for s in seen["saves"]] == list(range(step + 2, step + steps + 1, 2))
      for placed in seen["restores"] + seen["saves"]:
        assert placed.get("moved", 0) == 0, (devices, placed)
        assert placed["devices"] == devices, (devices, placed)
        if fsdp:
          # Every parameter of the tiny model has a dimension that 4 divides: device 0 holds a quarter of them.
          assert placed["sharded"] > 0 and placed["param_fraction"] == 1 / devices, (devices, placed)
        else:
          assert placed["sharded"] == 0 and placed["param_fraction"] == 1, (devices, placed)
      step += steps
  finally:
    for process in processes.values():
      process.close()
  assert step == STEPS
  for split, key in (("train", "loss"), ("train", "grad_norm"), ("eval", "loss")):
    straight, resumed = (logged(path, split, key) for path in (reference, run))
    assert sorted(resumed) == sorted(straight) == (list(range(1, STEPS + 1)) if split == "train" else [STEPS])
    np.testing.assert_allclose([resumed[s] for s in sorted(straight)], [straight[s] for s in sorted(straight)],
                               rtol=1e-4, err_msg=f"{split} {key}")


if __name__ == "__main__":
  sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "training")]
  replies, sys.stdout = sys.stdout, sys.stderr  # stdout carries the replies alone
  for request in sys.stdin:
    replies.write(json.dumps(run_segment(**json.loads(request))) + "\n")
    replies.flush()
