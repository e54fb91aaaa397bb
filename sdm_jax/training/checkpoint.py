"""Orbax checkpoints of a run: model, optimizer state, the data iterator's state, step and config.

A damaged latest checkpoint (unreadable files) falls back to the previous one with a warning.
"""

import json
import logging
import pathlib

import orbax.checkpoint as ocp
from flax import nnx


class Checkpointer:
  """Keeps the last `keep` checkpoints under <workdir>/checkpoints."""

  def __init__(self, workdir, keep=3):
    self.directory = pathlib.Path(workdir).resolve() / "checkpoints"
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self):
    return self.manager.latest_step()

  def save(self, step, model, optimizer, data_state, config):
    self.manager.save(step, args=ocp.args.Composite(
        model=ocp.args.StandardSave(nnx.state(model)),
        optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
        data=ocp.args.JsonSave(data_state),
        meta=ocp.args.JsonSave({"step": step, "config": json.loads(config.to_json_best_effort())})))
    self.manager.wait_until_finished()

  def restore(self, model, optimizer=None, iterator=None):
    """Restores the newest readable checkpoint into model (and optimizer, iterator); returns its step.

    Returns None when there is no readable checkpoint.
    """
    for step in sorted(self.manager.all_steps(), reverse=True):
      args = {"model": ocp.args.StandardRestore(nnx.state(model)), "meta": ocp.args.JsonRestore()}
      if optimizer is not None:
        args["optimizer"] = ocp.args.StandardRestore(nnx.state(optimizer))
      if iterator is not None:
        args["data"] = ocp.args.JsonRestore()
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(**args))
      except Exception as error:  # a partly written or corrupted step: try the one before
        logging.warning("checkpoint at step %d in %s is unreadable (%s: %s); falling back to an earlier one",
                        step, self.directory, type(error).__name__, str(error).splitlines()[0][:200])
        print(f"warning: checkpoint step {step} is unreadable, trying an earlier one", flush=True)
        continue
      nnx.update(model, restored["model"])
      if optimizer is not None:
        nnx.update(optimizer, restored["optimizer"])
      if iterator is not None:
        iterator.set_state(restored["data"])
      return step
    return None

  def close(self):
    self.manager.close()
