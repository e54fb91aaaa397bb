"""Orbax checkpoints of a run: model, optimizer state, the data iterator's state, and metadata (step, config,
the data state again, and a fingerprint of every array).

A checkpoint is saved only from a state whose every floating array is finite. Restoring checks what it read: the
metadata's step and the optimizer's step count against the checkpoint's step, its config against the run's
(`config.RESUMABLE_FIELDS` aside), the data state against its copy, every floating array finite and every array's
fingerprint as saved. Orbax does not checksum the array files, so a flipped bit otherwise comes back as a
different, usually finite, number. Every array restores into the sharding that the array it replaces has in the
reading run, so a checkpoint written on one mesh (any device count, FSDP or replicated) restores on another
(tests/training/test_multi_device.py). A checkpoint that fails any check (or cannot be read) is moved aside to
<workdir>/checkpoints_damaged/<step>, outside orbax's rotation, and the one before it is tried; a later save at
the same step then works; in a multi-process run the first process moves it and the others wait.
"""

import functools
import json
import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx

from sdm_jax.training.config import config_differences
from sdm_jax.training.workdir import DAMAGED, sync_processes


class NonFiniteState(ValueError):
  """A state with a non-finite array, which is never saved."""


def _words(x):
  """The bits of x as uint32 words, in x's shape (64-bit values as two words along a last axis)."""
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
  return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _fingerprint(x):
  """Two sums of x's 32-bit words mod 2^32, plain and weighted by 2 * (row-major position) + 1, and whether x is
  finite. Flipping bit k of one word moves each sum by an odd multiple of 2^k, never 0 mod 2^32; the weighted sum
  also changes when two words trade places."""
  words = _words(x)
  position = jnp.zeros(words.shape, jnp.uint32)
  for axis, size in enumerate(words.shape):
    position = position * jnp.uint32(size) + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis)
  sums = jnp.stack([jnp.sum(words, dtype=jnp.uint32), jnp.sum(words * (2 * position + 1), dtype=jnp.uint32)])
  finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.bool_(True)
  return sums, finite


@jax.jit
def _fingerprints(tree):
  return jax.tree.map(_fingerprint, tree)


def fingerprints(parts):
  """parts: {name: pytree} -> ({name: {path: 16 hex digits}} for every array, ["name path" of each non-finite
  array]), computed on the device in one program."""
  leaves = jax.tree_util.tree_flatten_with_path(parts)[0]
  results = jax.device_get(_fingerprints([x for _, x in leaves]))
  prints, non_finite = {name: {} for name in parts}, []
  for (path, _), (sums, finite) in zip(leaves, results):
    name, inner = path[0].key, jax.tree_util.keystr(path[1:])
    prints[name][inner] = "".join(f"{int(s):08x}" for s in sums)
    if not finite:
      non_finite.append(f"{name} {inner}")
  return prints, non_finite


def _first_line(error):
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0][:200] if text else ''}"


class Checkpointer:
  """Keeps the last `keep` checkpoints under <workdir>/checkpoints.

  warn: where the warnings about skipped checkpoints go (default: stderr).
  """

  def __init__(self, workdir, keep=3, *, warn=None):
    self.directory = pathlib.Path(workdir).resolve() / "checkpoints"
    self.damaged_directory = self.directory.parent / DAMAGED
    self.warn = warn or functools.partial(print, file=sys.stderr, flush=True)
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self):
    return self.manager.latest_step()

  def save(self, step, model, optimizer, data_state, config):
    """Saves and waits for the write; NonFiniteState (nothing written) if an array is not finite, RuntimeError if
    orbax declines the step (one at or before the newest kept step)."""
    parts = {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}
    prints, non_finite = fingerprints(parts)
    if non_finite:
      raise NonFiniteState(f"the {non_finite[0]} array is not finite ({len(non_finite)} such arrays)")
    meta = {"step": step, "config": json.loads(config.to_json_best_effort()), "data": data_state,
            "fingerprints": prints}
    saved = self.manager.save(step, args=ocp.args.Composite(
        model=ocp.args.StandardSave(parts["model"]), optimizer=ocp.args.StandardSave(parts["optimizer"]),
        data=ocp.args.JsonSave(data_state), meta=ocp.args.JsonSave(meta)))
    if not saved:
      raise RuntimeError(f"checkpoint step {step} was not saved: orbax keeps step {self.latest_step()} in "
                         f"{self.directory}, and saves only later steps")
    self.manager.wait_until_finished()

  def restore(self, model, optimizer=None, iterator=None, *, config=None, move_damaged=True):
    """Restores the newest checkpoint that reads and passes the checks into model (and optimizer, iterator), each
    array in the sharding its target has now; returns its step, or None when no checkpoint does.

    config: the run's config, which a checkpoint's must match (RESUMABLE_FIELDS aside); None skips that check.
    move_damaged: move a failing checkpoint to checkpoints_damaged/ (training) or only skip it (evaluation,
    which leaves the run as it is).
    """
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        problem, restored = self._read(step, model, optimizer, iterator, config)
      except Exception as error:  # a partly written or corrupted step: try the one before
        problem, restored = f"is unreadable ({_first_line(error)})", None
      if problem is None:
        nnx.update(model, restored["model"])
        if optimizer is not None:
          nnx.update(optimizer, restored["optimizer"])
        if iterator is not None:
          iterator.set_state(restored["data"])
        return step
      self._discard(step, problem, move_damaged)
    return None

  def _read(self, step, model, optimizer, iterator, config):
    """(None, the restored items) or (what is wrong with checkpoint `step`, None)."""
    meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    if meta.get("step") != step:
      return f"has metadata of step {meta.get('step')}", None
    if config is not None and (differences := config_differences(meta["config"], config)):
      return f"was written by another config ({'; '.join(differences[:5])})", None
    args = {"model": ocp.args.StandardRestore(nnx.state(model))}
    if optimizer is not None:
      args["optimizer"] = ocp.args.StandardRestore(nnx.state(optimizer))
    if iterator is not None:
      args["data"] = ocp.args.JsonRestore()
    restored = self.manager.restore(step, args=ocp.args.Composite(**args))
    if iterator is not None and "data" in meta and restored["data"] != meta["data"]:
      return f"has data state {restored['data']} but its metadata says {meta['data']}", None
    if optimizer is not None and (held := int(restored["optimizer"]["step"][...])) != step:
      return f"holds an optimizer at step {held}", None
    prints, non_finite = fingerprints({name: restored[name] for name in args if name != "data"})
    for name, restored_prints in prints.items():  # first: damage of any kind, finite or not, shows here
      saved = meta.get("fingerprints", {}).get(name)  # checkpoints written before fingerprints have none
      if saved is not None and (changed := sorted(k for k in saved if restored_prints.get(k) != saved[k])):
        return (f"is damaged: its {name} array {changed[0]} differs from what was saved ({len(changed)} such "
                f"arrays)"), None
    if non_finite:  # only a checkpoint without fingerprints gets here with one
      return f"has a non-finite array ({non_finite[0]})", None
    return None, restored

  def _discard(self, step, problem, move):
    if not move:
      self.warn(f"warning: checkpoint step {step} {problem}; skipping it")
      return
    target, n = self.damaged_directory / str(step), 1
    while target.exists():
      target, n = self.damaged_directory / f"{step}.{n}", n + 1
    if jax.process_index() == 0:  # every process found the same problem (the checks read global arrays)
      self.damaged_directory.mkdir(exist_ok=True)
      shutil.move(str(self.directory / str(step)), str(target))
    sync_processes(f"checkpoint {step} moved aside")
    self.manager.reload()
    self.warn(f"warning: checkpoint step {step} {problem}; moved it to {target}")

  def close(self):
    self.manager.close()
