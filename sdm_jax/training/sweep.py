r"""A sweep: a grid of config values x seeds, each (point, seed) a training run in its own sub-workdir, resumable.

    <workdir>/sweep.json                   the newest call's grid, seeds and evaluation points
    <workdir>/<point>/seed_<s>/            a run directory (training.workdir) and
        point.json                         its grid values, seed and evaluation points (what the summary reads)
        run_config.json                    the config it trains with (train() writes config.json itself)
        eval.json                          the final checkpoint on the training config (as experiments.eval writes)
        eval_points.json                   the final checkpoint on each evaluation point

Grid text, `axis=v1|v2|...;axis2=...`: an axis is a config field (`model.mixer`, `data.seq_len`), several fields
set together (`data.seq_len,data.num_kv_pairs=64,4|128,8`), or `variant`, a variant of the config file
(`variant=mqar_gdn|mqar_sdm`; the command line's --config.<field> overrides apply to each). Values are parsed by
the field's type as --config.<field>=<value> would be. Evaluation points use the same text over data fields (and
train.eval_batches): each finished run is evaluated again with them changed (`data.seq_len=1024|4096`: length
extrapolation), the parameters unchanged.

Each run is one process (`python -m sdm_jax.training.sweep <run dir>`): a run that crashes (out of memory, a
kernel fault) or diverges costs only itself, each starts with fresh device memory, and a persistent compilation
cache shared by the sweep (`<workdir>/.jax_cache`) spares the seeds of a point their compilation. For many short
runs of small models, where a process's start and compilation cost more than its training, `in_process` runs
them one after another in the calling process instead (the seeds of a point then share one jitted step). A run whose
evaluations of its checkpoint at its final step (train.steps, or the evaluation that reached train.stop_at_accuracy:
loop.final_step) are all written is skipped, its checkpoints kept or not (results copied back from another machine
without them); any other resumes (training from its newest checkpoint, then the missing
evaluations). SIGINT stops the running run at a step boundary with a
checkpoint (training.loop) and then the sweep; a second stops at once.
"""

import ast
import contextlib
import copy
import dataclasses
import itertools
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import ml_collections
from absl import flags
from ml_collections.config_flags import tuple_parser

from sdm_jax import jsonio
from sdm_jax.training.config import ConfigError, close_names
from sdm_jax.training.workdir import absolute_paths, checkpoint_steps

VARIANT = "variant"
POINT = "point.json"
RUN_CONFIG = "run_config.json"
EVAL = "eval.json"
EVAL_POINTS = "eval_points.json"
SWEEP = "sweep.json"
# The fields an evaluation point may change besides data.*: which batches are scored, never a parameter.
EVAL_FIELDS = ("train.eval_batches",)
_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9._-]+")


class SweepInterrupted(Exception):
  """SIGINT / SIGTERM (`signum`) stopped the sweep: the running run at a step boundary with its checkpoint saved,
  or before the next run."""

  def __init__(self, message, signum):
    self.signum = signum
    super().__init__(message)


@dataclasses.dataclass(frozen=True)
class Axis:
  """One axis of a grid: the fields it sets together and, per value, one parsed value per field."""
  fields: tuple[str, ...]
  values: tuple[tuple, ...]
  texts: tuple[str, ...]  # the values as written


def load_config_file(path_variant):
  """'path/to/config.py:variant' -> that file's get_config(variant) (get_config() without a variant)."""
  import importlib.util
  path, _, variant = str(path_variant).partition(":")
  if not os.path.isfile(path):
    raise ConfigError(f"--config: expected 'path/to/config.py:variant' naming an existing file, got {path_variant!r}")
  spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant) if variant else module.get_config()


def _split_top_level(text, separator):
  """text split at `separator` outside brackets: '(4, 8),16' -> ['(4, 8)', '16'] for ','."""
  parts, depth, start = [], 0, 0
  for i, character in enumerate(text):
    depth += character in "([{"
    depth -= character in ")]}"
    if character == separator and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  parts.append(text[start:])
  return [part.strip() for part in parts]


def _field(config, field):
  """The current value of dotted `field` in config; ConfigError naming the part that does not exist."""
  node, path = config, []
  for name in field.split("."):
    if not isinstance(node, (dict, ml_collections.ConfigDict)) or name not in node:
      where = ".".join(path) or "config"
      choices = list(node) if isinstance(node, (dict, ml_collections.ConfigDict)) else []
      raise ConfigError(f"--grid axis {field!r}: {where} has no field {name!r}{close_names(name, choices)}")
    node = node[name]
    path.append(name)
  if isinstance(node, (dict, ml_collections.ConfigDict)):
    raise ConfigError(f"--grid axis {field!r}: a section, not a field; name one of its fields {sorted(node)}")
  return node


def parse_value(field, text, current):
  """`text` as a value of a field holding `current`, parsed as --config.<field>=<text> would be."""
  def fail(expected):
    raise ConfigError(f"--grid {field}={text!r}: expected {expected} (the field holds {current!r})")
  if isinstance(current, bool):
    try:
      return flags.BooleanParser().parse(text)
    except ValueError:
      fail("true or false")
  if isinstance(current, int):
    try:
      return flags.IntegerParser().parse(text)
    except ValueError:
      fail("an integer")
  if isinstance(current, float):
    try:
      return float(flags.FloatParser().parse(text))
    except ValueError:
      fail("a number")
  if isinstance(current, str):
    return text
  if isinstance(current, (tuple, list)):
    try:
      return tuple(tuple_parser.TupleParser().parse(text))
    except (ValueError, SyntaxError):
      fail("a tuple such as '(4, 8)'")
  try:  # None or anything else: a Python literal, else the text itself (config_flags' literal parser)
    return ast.literal_eval(text.capitalize() if text in ("true", "false") else text)
  except (ValueError, SyntaxError):
    return text


def parse_grid(text, config, *, variants=None, allowed=None, flag="--grid"):
  """Axes of grid `text` ('axis=v1|v2;...') against `config`; ConfigError on an unknown field or a bad value.

  variants: the config of each value of a `variant` axis is variants(value) (None: no variant axis allowed);
  allowed: None, or a predicate a field must pass (evaluation points: data fields).
  """
  axes, seen = [], set()
  for part in [part for part in _split_top_level(text or "", ";") if part]:
    name, equals, values_text = part.partition("=")
    fields = tuple(field.strip() for field in name.split(","))
    if not equals or not all(fields) or not values_text.strip():
      raise ConfigError(f"{flag}: expected 'field=v1|v2|...' (axes separated by ';'), got {part!r}")
    for field in fields:
      if field in seen:
        raise ConfigError(f"{flag}: {field!r} is on two axes")
      seen.add(field)
      if field == VARIANT:
        if variants is None or len(fields) > 1:
          raise ConfigError(f"{flag}: {VARIANT!r} is an axis of its own, and only of --grid")
      elif allowed is not None and not allowed(field):
        raise ConfigError(f"{flag}: {field!r} cannot change there; expected data fields or {EVAL_FIELDS}")
      else:
        _field(config, field)
    texts = [value for value in (v.strip() for v in values_text.split("|"))]
    if any(not value for value in texts) or len(set(texts)) != len(texts):
      raise ConfigError(f"{flag} {name}: expected distinct non-empty values separated by '|', got {values_text!r}")
    values = []
    for value_text in texts:
      pieces = _split_top_level(value_text, ",") if len(fields) > 1 else [value_text]
      if len(pieces) != len(fields):
        raise ConfigError(f"{flag} {name}={value_text!r}: expected {len(fields)} comma-separated values, one per "
                          f"field")
      if fields == (VARIANT,):
        variants(value_text)  # a variant that does not exist fails here, before anything runs
        values.append((value_text,))
      else:
        values.append(tuple(parse_value(field, piece, _field(config, field)) for field, piece in zip(fields, pieces)))
    axes.append(Axis(fields, tuple(values), tuple(texts)))
  return axes


def expand(axes):
  """Every point of the grid: a dict {field: value} per combination, the first axis slowest; [{}] for no axes."""
  points = []
  for combination in itertools.product(*[axis.values for axis in axes]):
    point = {}
    for axis, values in zip(axes, combination):
      point.update(zip(axis.fields, values))
    points.append(point)
  return points


def _value_name(value):
  if isinstance(value, (tuple, list)):
    return "-".join(_value_name(item) for item in value) or "none"
  return _NAME_CHARACTERS.sub("-", str(value))


def point_names(points):
  """A directory name per point, 'mixer-gdn_seq_len-128' from its fields' last parts (whole paths where two axes
  share one); '.' for the single point of an empty grid. ValueError if two points would share a name."""
  fields = list(points[0]) if points else []
  short = {field: field.split(".")[-1] for field in fields}
  for field in fields:
    if list(short.values()).count(short[field]) > 1:
      short[field] = field
  names = ["_".join(f"{short[field]}-{_value_name(value)}" for field, value in point.items()) or "."
           for point in points]
  if len(set(names)) != len(names):
    raise ConfigError(f"--grid: two points would share a directory name ({names}); use values that differ in "
                      f"letters or digits")
  return names


def apply(config, point):
  """A copy of config with the point's fields set (a 'variant' entry is ignored here: see point_config)."""
  config = copy.deepcopy(config)
  for field, value in point.items():
    if field == VARIANT:
      continue
    section, _, name = field.rpartition(".")
    node = config
    for part in section.split(".") if section else []:
      node = node[part]
    with node.ignore_type() if isinstance(node, ml_collections.ConfigDict) else _nothing():
      node[name] = list(value) if isinstance(value, tuple) and isinstance(node[name], list) else value
  return config


class _nothing:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def seeded(config, seed):
  """config for replicate `seed`: the model's initialisation and the data stream both offset by it."""
  config = copy.deepcopy(config)
  config.seed = int(config.seed) + seed
  config.data.seed = int(config.data.seed) + seed
  return config


@dataclasses.dataclass
class Run:
  name: str  # '<point>/seed_<s>'
  directory: pathlib.Path
  point: dict
  seed: int
  config: ml_collections.ConfigDict
  eval_points: list


def plan(point_config, axes, seeds, workdir, eval_axes=()):
  """The runs of a sweep: one per (grid point, seed), the first axis slowest and seeds fastest.

  point_config(point) -> the ConfigDict of a grid point; seeds: the replicate numbers (0, 1, 2).
  """
  points = expand(axes)
  eval_points = expand(eval_axes) if eval_axes else []
  runs = []
  for point, name in zip(points, point_names(points)):
    config = point_config(point)
    for seed in seeds:
      directory = pathlib.Path(workdir).absolute() / name / f"seed_{seed}"
      runs.append(Run(f"{name}/seed_{seed}".lstrip("./"), directory, point, seed,
                      absolute_paths(seeded(config, seed)), eval_points))
  return runs


def _read_json(path):
  try:
    return json.loads(pathlib.Path(path).read_text())
  except (OSError, ValueError):
    return None


def _write_json(path, value):
  jsonio.replace_text(path, json.dumps(value, indent=2, default=_jsonable) + "\n")


def _jsonable(value):
  if isinstance(value, ml_collections.ConfigDict):
    return value.to_dict()
  if isinstance(value, tuple):
    return list(value)
  return str(value)


def _same(a, b):
  return json.loads(json.dumps(a, default=_jsonable)) == json.loads(json.dumps(b, default=_jsonable))


def status(run_dir, steps, eval_points=()):
  """'done' (every evaluation is written, of the checkpoint at `steps`: the run's results, with or without its
  checkpoints, e.g. copied back from another machine without them), 'partial' (something to resume) or 'new'."""
  run_dir = pathlib.Path(run_dir)
  final = _read_json(run_dir / EVAL)
  if final is not None and final.get("step") == steps and not _missing_points(run_dir, steps, eval_points)[1]:
    return "done"
  if checkpoint_steps(run_dir) or (run_dir / "config.json").exists():
    return "partial"
  return "new"


def _missing_points(run_dir, steps, eval_points):
  """(written, missing): the evaluations at other points written for the checkpoint at `steps` (those of an earlier
  number of steps dropped), and the points of eval_points that have none."""
  written = [entry for entry in _read_json(pathlib.Path(run_dir) / EVAL_POINTS) or [] if entry.get("step") == steps]
  return written, [point for point in eval_points if not any(_same(entry["point"], point) for entry in written)]


def prepare(run):
  """Writes the run's point.json and run_config.json (the process that trains it reads them)."""
  run.directory.mkdir(parents=True, exist_ok=True)
  _write_json(run.directory / POINT, {"point": run.point, "seed": run.seed, "eval_points": run.eval_points})
  _write_json(run.directory / RUN_CONFIG, run.config.to_dict())


def subprocess_runner(cache_dir=None, extra_args=()):
  """A runner: trains and evaluates a prepared run directory in a process of its own, its lines passed to log.

  Within a StopSignals context (run_sweep's) the process runs in a session of its own and gets each signal from
  this one, once: a terminal's Ctrl-C reaches the whole foreground group, and a run that got it twice (directly
  and forwarded) would stop without its checkpoint."""
  def run(run_dir, log):
    from sdm_jax.training.loop import StopSignals
    stop = StopSignals._active
    env = dict(os.environ)
    if cache_dir is not None:
      env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_dir))
    command = [sys.executable, "-m", "sdm_jax.training.sweep", str(run_dir), *extra_args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=stop is not None) as process, \
        (stop.forwarding(process.send_signal) if stop is not None else contextlib.nullcontext()):
      if stop is not None and stop.signum is not None:  # it came while the process was starting
        process.send_signal(stop.signum)
      tail = []
      for line in process.stdout:
        line = line.rstrip("\n")
        tail = (tail + [line])[-20:]
        log(f"  {line}")
      code = process.wait()
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
      raise SweepInterrupted(f"{run_dir}: stopped by {signal.Signals(code - 128).name} at a step boundary; its "
                             f"checkpoint is saved", code - 128)
    if code:
      last = next((line for line in reversed(tail) if line.strip()), "")
      raise RuntimeError(f"exit {code}: {last}")
  return run


def in_process_runner(eval_batches=None):
  """A runner that trains and evaluates in this process: no start-up or compilation per run (runs of one model
  shape share the jitted step), for many small runs; a crash of one ends the sweep."""
  def run(run_dir, log):
    from sdm_jax.training.loop import TrainingInterrupted
    try:
      run_one(run_dir, eval_batches=eval_batches, log=lambda line: log(f"  {line}"))
    except TrainingInterrupted as error:
      raise SweepInterrupted(str(error), error.signum) from None
  return run


def ensemble_trainer(eval_batches=None):
  """together(runs, log) for `run_sweep`: trains the runs of one grid point that still need training in lockstep
  (`ensemble.train_ensemble`), those resuming from one step together; a run left alone (the only one at its step)
  or whose ensemble failed is left to the runner, and a run that diverged there is trained again by it, from its
  last good checkpoint."""
  def together(runs, log):
    from sdm_jax.training.ensemble import train_ensemble
    from sdm_jax.training.loop import TrainingInterrupted, final_step
    by_step = {}
    for run in runs:
      config = copy.deepcopy(run.config)
      if eval_batches:
        config.train.eval_batches = eval_batches
      if final_step(run.directory, config.train) not in checkpoint_steps(run.directory):
        by_step.setdefault((checkpoint_steps(run.directory) or [0])[-1], []).append((run, config))
    for members in by_step.values():
      if len(members) < 2:
        continue
      names = ", ".join(run.name for run, _ in members)
      log(f"ensemble: {names} trained together")
      try:
        train_ensemble([config for _, config in members], [run.directory for run, _ in members],
                       log=lambda line: log(f"  {line}"))
      except TrainingInterrupted as error:
        raise SweepInterrupted(str(error), error.signum) from None
      except Exception as error:  # those runs are trained alone instead
        log(f"ensemble of {names} failed ({type(error).__name__}: {error}); they run alone")
  return together


def run_sweep(runs, *, runner, log=print, workdir=None, description=None, together=None):
  """Runs every run that is not done, in order; returns {run name: 'done' | 'skipped' | 'failed: ...'}.

  runner(run_dir, log) trains and evaluates one prepared run directory (subprocess_runner, or in-process in tests)
  and raises on failure; a failure is reported and the sweep goes on. together(runs, log), if given
  (`ensemble_trainer`), is called once per grid point, before its first run that is not done, with the point's
  runs that are not done. description, if given, is written to <workdir>/sweep.json first. SIGINT / SIGTERM stop the
  running run at a step boundary with its checkpoint (the runner's process gets the signal from here) and raise
  SweepInterrupted; a second stops at once (StopSignals).
  """
  from sdm_jax.training.loop import StopSignals
  if workdir is not None and description is not None:
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    _write_json(pathlib.Path(workdir) / SWEEP, description)
  with StopSignals() as stop:
    return _run_all(runs, runner, log, stop, together)


def _run_all(runs, runner, log, stop, together=None):
  from sdm_jax.training.loop import final_step
  outcomes, points_begun = {}, set()
  for index, run in enumerate(runs, 1):
    if stop.signum is not None:
      raise SweepInterrupted(f"stopped by {signal.Signals(stop.signum).name} before {run.name}", stop.signum)
    state = status(run.directory, final_step(run.directory, run.config.train), run.eval_points)
    prefix = f"[{index}/{len(runs)}] {run.name}"
    if state == "done":
      log(f"{prefix}: done, skipped")
      outcomes[run.name] = "skipped"
      continue
    if together is not None and run.directory.parent not in points_begun:
      points_begun.add(run.directory.parent)
      together([other for other in runs[index - 1:] if other.directory.parent == run.directory.parent
                and status(other.directory, final_step(other.directory, other.config.train),
                           other.eval_points) != "done"], log)
    log(f"{prefix}: {'resuming' if state == 'partial' else 'starting'} ({run.config.train.steps} steps)")
    prepare(run)
    start = time.perf_counter()
    try:
      runner(run.directory, log)
    except SweepInterrupted:
      raise
    except Exception as error:  # one failed run costs only itself
      outcomes[run.name] = f"failed: {type(error).__name__}: {error}"
      log(f"{prefix}: FAILED after {time.perf_counter() - start:.0f}s: {type(error).__name__}: {error}")
      continue
    final = _read_json(run.directory / EVAL) or {}
    outcomes[run.name] = "done"
    metrics = " ".join(f"{key} {final[key]:.4f}" for key in ("accuracy", "exact_match", "loss") if key in final)
    log(f"{prefix}: done in {time.perf_counter() - start:.0f}s: {metrics}")
  return outcomes


def run_one(run_dir, *, eval_batches=None, log=print, train_fn=None, evaluate_fn=None):
  """Trains the prepared run in run_dir to its config's steps (resuming from its newest checkpoint), then writes
  what is missing of eval.json and eval_points.json. train_fn / evaluate_fn stand in for the training loop's
  train and (model, config) -> metrics in tests."""
  run_dir = pathlib.Path(run_dir)
  config = ml_collections.ConfigDict(json.loads((run_dir / RUN_CONFIG).read_text()))
  spec = json.loads((run_dir / POINT).read_text())
  if eval_batches:
    config.train.eval_batches = eval_batches
  from sdm_jax.training.loop import final_step
  steps = final_step(run_dir, config.train)  # train.steps, or where an evaluation reached train.stop_at_accuracy
  if steps not in checkpoint_steps(run_dir):
    if train_fn is None:
      from sdm_jax.training.loop import train as train_fn
    train_fn(config, run_dir, log=log)
    steps = final_step(run_dir, config.train)
  final = _read_json(run_dir / EVAL)
  written, missing = _missing_points(run_dir, steps, spec["eval_points"])
  if final is not None and final.get("step") == steps and not missing:
    return
  model = None
  if evaluate_fn is None:
    from sdm_jax.evaluation.lm_eval import evaluate
    from sdm_jax.training.loop import restore_for_eval
    model, step, mesh = restore_for_eval(run_dir, config)
    if step != steps:
      raise RuntimeError(f"{run_dir}: the newest good checkpoint is step {step}, not the final step {steps}")
    evaluate_fn = lambda model, config: evaluate(model, config, mesh)
  if final is None or final.get("step") != steps:
    final = {"step": steps, **evaluate_fn(model, config)}
    _write_json(run_dir / EVAL, final)
    log(f"eval: accuracy {final['accuracy']:.4f} exact match {final['exact_match']:.4f} loss {final['loss']:.4f}")
  for point in missing:
    metrics = evaluate_fn(model, apply(config, point))
    written.append({"point": point, "step": steps, **metrics})
    _write_json(run_dir / EVAL_POINTS, written)
    where = " ".join(f"{field}={value}" for field, value in point.items())
    log(f"eval at {where}: accuracy {metrics['accuracy']:.4f} exact match {metrics['exact_match']:.4f}")


def point_configs(config, config_file, overrides):
  """point -> its ConfigDict: `config` with the point's fields set, or for a point with a variant, that variant of
  config_file ('path.py:variant') with the command line's overrides ({field: value}) set again first."""
  path = str(config_file).partition(":")[0]

  def variant(name):
    try:
      loaded = load_config_file(f"{path}:{name}")
    except ConfigError:
      raise
    except Exception as error:  # the config file's own check of its variant names
      raise ConfigError(f"--grid {VARIANT}={name}: {str(error).splitlines()[0]}") from None
    return apply(loaded, dict(overrides))

  def point_config(point):
    return apply(variant(point[VARIANT]) if VARIANT in point else config, point)
  return point_config, variant


def parse_shard(text):
  """'i/n' -> (i, n) with 0 <= i < n: this process takes the planned runs i, i + n, i + 2n, ... (several processes
  sharing one device, each with its own shard of one sweep); ValueError naming --shard otherwise."""
  try:
    index, count = (int(part) for part in text.split("/"))
  except ValueError:
    index = count = None
  if index is None or count < 1 or not 0 <= index < count:
    raise ValueError(f"--shard: expected i/n with 0 <= i < n (e.g. 0/3), got {text!r}")
  return index, count


def describe(runs, config_file, grid, eval_grid, seeds):
  path, colon, variant = str(config_file).partition(":")
  return {"config": str(pathlib.Path(path).absolute()) + colon + variant, "grid": grid, "eval_grid": eval_grid,
          "seeds": list(seeds), "runs": [run.name for run in runs]}


def sweep(config, *, config_file, overrides, grid, eval_grid, seeds, workdir, eval_batches=None, dry_run=False,
          in_process=False, ensemble=False, out=None, runner=None, shard=(0, 1), log=print):
  """Plans the grid (every point's config checked before anything runs), runs what is not done, summarizes.

  config: the --config ConfigDict (its overrides applied); config_file: its 'path.py:variant'; overrides: the
  command line's {field: value}; grid / eval_grid: grid texts; seeds: replicate numbers; in_process: run in this
  process (in_process_runner) instead of one process per run; ensemble (with in_process): the seeds of a grid point
  trained together in lockstep (`ensemble_trainer`); shard: (i, n), run only the planned runs i, i + n, ... (with
  ensemble, the grid points i, i + n, ..., each with all its seeds) (`parse_shard`; the summary still covers every
  finished run of the workdir). Returns the outcomes.
  """
  if ensemble and not in_process:
    raise ConfigError("--ensemble: trains a point's seeds together in this process, expected --in_process with it")
  from sdm_jax.data import make_dataset
  from sdm_jax.training.config import check_config
  from sdm_jax.training.sweep_summary import summarize
  point_config, variant = point_configs(config, config_file, overrides)
  axes = parse_grid(grid, config, variants=variant)
  probe = point_config(expand(axes)[0])
  eval_axes = parse_grid(eval_grid, probe, allowed=lambda field: field.startswith("data.") or field in EVAL_FIELDS,
                         flag="--eval_grid")
  runs = plan(point_config, axes, seeds, workdir, eval_axes)
  checked = set()
  for run in runs:  # one check per point: the seeds only move seeds
    key = run.name.rsplit("/", 1)[0] if "/" in run.name else "(the config itself)"
    if key not in checked:
      try:
        check_config(run.config)
      except ConfigError as error:
        raise ConfigError(f"grid point {key}: {error}") from None
      for eval_point in run.eval_points:  # the data of an evaluation point, built (nothing read) before any run
        try:
          make_dataset(apply(run.config, eval_point), "validation")
        except ValueError as error:
          where = " ".join(f"{field}={value}" for field, value in eval_point.items())
          raise ConfigError(f"--eval_grid {where} (grid point {key}): {str(error).splitlines()[0]}") from None
      checked.add(key)
  log(f"sweep: {len(runs)} run(s) = {len(runs) // len(seeds)} point(s) x {len(seeds)} seed(s)"
      f"{f', each evaluated at {len(runs[0].eval_points)} more point(s)' if runs and runs[0].eval_points else ''}"
      f" in {workdir}")
  index, count = shard
  mine = runs[index::count]
  if ensemble:  # a point's seeds stay in one shard
    points = list(dict.fromkeys(run.directory.parent for run in runs))[index::count]
    mine = [run for run in runs if run.directory.parent in points]
  if count > 1:
    log(f"sweep: shard {index}/{count}: {len(mine)} of the {len(runs)} run(s)")
  if dry_run:
    from sdm_jax.training.loop import final_step
    for run in mine:
      log(f"  {run.name}: {status(run.directory, final_step(run.directory, run.config.train), run.eval_points)}")
    return {}
  if runner is None and in_process:
    import jax
    if not jax.config.jax_compilation_cache_dir:  # a later call on the same machine compiles nothing again
      jax.config.update("jax_compilation_cache_dir", str(pathlib.Path(workdir) / ".jax_cache"))
    runner = in_process_runner(eval_batches)
  elif runner is None:
    runner = subprocess_runner(pathlib.Path(workdir) / ".jax_cache",
                               extra_args=[str(eval_batches)] if eval_batches else [])
  outcomes = run_sweep(mine, runner=runner, log=log, workdir=workdir,
                       description=describe(runs, config_file, grid, eval_grid, seeds),
                       together=ensemble_trainer(eval_batches) if ensemble else None)
  failed = [name for name, outcome in outcomes.items() if outcome.startswith("failed")]
  log(f"sweep: {len(outcomes) - len(failed)} of {len(outcomes)} run(s) done"
      f"{'; failed: ' + ', '.join(failed) if failed else ''}")
  try:
    summarize([workdir], out or pathlib.Path(workdir) / "summary", log=log)
  except ValueError as error:
    log(f"no summary: {error}")
  return outcomes


def main(argv):
  """`python -m sdm_jax.training.sweep <run dir> [eval_batches]`: one run of a sweep, in its own process."""
  run_dir = argv[1]
  eval_batches = int(argv[2]) if len(argv) > 2 else None
  log = lambda line: print(line, flush=True)
  from sdm_jax.training.loop import StopSignals, TrainingInterrupted
  try:
    with StopSignals():  # a signal during the evaluations lets them finish; the sweep stops before the next run
      run_one(run_dir, eval_batches=eval_batches, log=log)
  except TrainingInterrupted as error:
    print(error, flush=True)
    sys.exit(128 + error.signum)


if __name__ == "__main__":
  main(sys.argv)
