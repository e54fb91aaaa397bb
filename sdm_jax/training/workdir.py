"""A run directory, and how a new call of the training program may use one that already holds a run.

    <workdir>/config.json           the run's config (the newest call's; calls differ at most in RESUMABLE_FIELDS)
    <workdir>/checkpoints/          orbax checkpoints (checkpoint.py)
    <workdir>/checkpoints_damaged/  checkpoints that failed the checks of a restore
    <workdir>/metrics.jsonl, metrics.png, eval.json, lm_eval.json
    <workdir>/tensorboard/, profile/, wandb/, wandb_run_id   the metric writers and traces (metrics.py)

A workdir remembers its config. A call with checkpoints to continue resumes only with the same config, up to
`config.RESUMABLE_FIELDS`; it refuses a config that differs elsewhere, and refuses to start afresh (resume=False)
over the checkpoints; `overwrite` is the one way to start afresh in a used workdir, and removes what the earlier
run wrote there (only that). A workdir without checkpoints holds nothing to continue: a call starts afresh there.
Nothing is written before these checks pass (`check_start`, then `start`).
"""

import json
import pathlib
import shutil

import jax
import ml_collections

from sdm_jax import jsonio
from sdm_jax.training.config import RESUMABLE_FIELDS, config_differences

CONFIG = "config.json"
DAMAGED = "checkpoints_damaged"
RUN_FILES = (CONFIG, "metrics.jsonl", "metrics.png", "eval.json", "lm_eval.json", "wandb_run_id")
RUN_DIRECTORIES = ("checkpoints", DAMAGED, "tensorboard", "profile", "wandb")


class WorkdirError(ValueError):
  """A workdir that this call must not use as asked; the message says why and what would."""


def load_config(workdir):
  """The config a run directory was trained with (its config.json), as a ConfigDict."""
  path = pathlib.Path(workdir) / CONFIG
  if not path.is_file():
    raise WorkdirError(f"workdir: expected a run directory written by experiments.train, but {path} does not exist")
  try:
    config = json.loads(path.read_text())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
    raise WorkdirError(f"workdir: {path} is damaged: expected the run's config as JSON ({error})") from None
  if not isinstance(config, dict) or not {"model", "data", "train"} <= set(config):
    raise WorkdirError(f"workdir: {path} is damaged: expected the run's config (model, data, train)")
  return ml_collections.ConfigDict(config)


def checkpoint_steps(workdir):
  """The steps of the checkpoints in workdir (orbax names a finished step's directory by its number)."""
  directory = pathlib.Path(workdir) / "checkpoints"
  if not directory.is_dir():
    return []
  return sorted(int(path.name) for path in directory.iterdir() if path.is_dir() and path.name.isdigit())


def check_start(workdir, config, *, resume=True, overwrite=False):
  """Raises WorkdirError unless a call with `config` may use workdir as asked. Reads only."""
  workdir = pathlib.Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise WorkdirError(f"workdir: {workdir} is a file; expected a directory (new or a run's)")
  steps = checkpoint_steps(workdir)
  if overwrite or not steps:
    return
  held = f"{workdir} holds the checkpoints of a run (steps {', '.join(map(str, steps))})"
  if not resume:
    raise WorkdirError(f"workdir: {held}; starting afresh over them would mix two runs. Resume it (drop "
                       f"--noresume) or pass --overwrite to delete that run and start afresh")
  if not (workdir / CONFIG).is_file():
    raise WorkdirError(f"workdir: {held} but no {CONFIG}, so its config is unknown; put back its {CONFIG} or "
                       f"pass --overwrite to delete that run and start afresh")
  differences = config_differences(absolute_paths(load_config(workdir)), config)
  if differences:
    raise WorkdirError(f"workdir: {held}, trained with another config: {'; '.join(differences)}. Resume it with "
                       f"its own config (only {', '.join(RESUMABLE_FIELDS)} may change) or pass --overwrite to "
                       f"delete that run and start afresh")


def absolute_paths(config):
  """config (changed in place, and returned) with its data's path fields (the task's PATH_FIELDS: a corpus's
  data_dir) made absolute from the current directory, so a run's config.json names its data wherever it is read."""
  from sdm_jax.data.pipeline import TASKS
  data = config.get("data") or {}
  for field in getattr(TASKS.get(data.get("name")), "PATH_FIELDS", ()):
    if isinstance(data.get(field), str) and data[field]:
      data[field] = str(pathlib.Path(data[field]).absolute())
  return config


def sync_processes(name):
  """Waits until every process of a multi-process run reaches this point (nothing to wait for in one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def start(workdir, config, *, overwrite=False):
  """Writes config.json (call after check_start). Under overwrite first removes everything an earlier run wrote;
  without checkpoints to continue, its metrics and evaluation (checkpoints_damaged/ stays)."""
  workdir = pathlib.Path(workdir)
  if overwrite or not checkpoint_steps(workdir):
    clear(workdir, directories=overwrite)
  workdir.mkdir(parents=True, exist_ok=True)
  jsonio.replace_text(workdir / CONFIG, config.to_json_best_effort(indent=2))


def clear(workdir, *, directories=True):
  """Removes the files (and directories) a run writes in workdir, and nothing else."""
  workdir = pathlib.Path(workdir)
  for name in RUN_FILES:
    (workdir / name).unlink(missing_ok=True)
  for name in RUN_DIRECTORIES if directories else ():
    shutil.rmtree(workdir / name, ignore_errors=True)
