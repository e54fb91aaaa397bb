"""The one registry of what can be timed: `MODES`, each a name, one line on what it times, its settings and the
library module that times it and writes its report. `experiments/bench.py` is its command line.

Settings are a frozen dataclass per mode: the defaults are the GPU measurement's (DESIGN.md section 7), `Mode.cpu`
holds the ones that shrink on a CPU backend, and `settings(what, overrides, backend)` applies them, then the
"name=value" overrides. A mode's module has `bench(settings, out_dir, tag, log)`, which measures, writes
<out_dir>/<date>_<tag>.{json,md[,png]} (`timing.write_tables`, after every point where a point is slow) and
returns (records, paths), and `check_settings(settings)`, which raises ValueError for settings that cannot run. The
modules are imported only when their mode runs.

`bench(..., base=<commit>)` times the same mode in another tree beside this one, as fla's benchmark runner does
(fla's ops runner, `run.py`, copies the runner beside each commit's package): the commit is written to a
temporary directory (`git archive`) and this tree's harness (`HARNESS`) is laid over it, so both trees are timed
by the same code and only the code under it differs. Each tree runs in a process of its own, one after the other,
so each has the device to itself (this process never starts JAX's backend); their reports stay under
<out_dir>/<tag>_trees/{this,base}/, and one report holds both trees' rows with a `tree` column and, for each of
the mode's lower-is-better numbers (`Mode.compared`), vs base = base / this (above 1: this tree is faster or
smaller).
"""

import dataclasses
import glob
import importlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import typing
from typing import Any, Optional

from sdm_jax.training.config import ConfigError, close_names

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What a --base run takes from this tree: the measuring code and its command line.
HARNESS = ("sdm_jax/benchmarking", "experiments/__init__.py", "experiments/cli.py", "experiments/bench.py")
TREES = ("this", "base")


def _setting(default, help_text):
  if isinstance(default, dict):
    return dataclasses.field(default_factory=lambda: dict(default), metadata={"help": help_text})
  return dataclasses.field(default=default, metadata={"help": help_text})


def _dense_mixers():
  from sdm_jax import ops
  return tuple(ops.MIXERS)


@dataclasses.dataclass(frozen=True)
class OpsSettings:
  mixers: tuple[str, ...] = _setting(("kda", "gdn2"), "mixers of the registry sdm_jax.ops.MIXERS")
  impls: tuple[str, ...] = _setting(("chunk",), "impls of the op: scan, chunk, pallas")
  shapes: tuple[str, ...] = _setting(("8x2048", "4x4096", "2x8192", "1x16384", "1x32768"), "B x T of each run")
  heads: int = _setting(16, "H")
  head_dim: int = _setting(128, "K, the key dimension per head")
  value_dim: Optional[int] = _setting(None, "V per head (none: head_dim)")
  dtype: str = _setting("bfloat16", "input dtype: bfloat16, float16 or float32 (g stays fp32)")
  chunk_size: tuple[int, ...] = _setting((), "chunk sizes of the chunked impls, each timed (none: each impl's rule)")
  reps: int = _setting(20, "warm runs per timing (median)")
  seed: int = _setting(0, "seed of the first of the 3 input sets")
  peer: bool = _setting(True, "also time fla's Triton chunk_kda / chunk_gdn2 where torch, a GPU and fla are here")
  peer_modes: tuple[str, ...] = _setting(("plain",), "fla's modes, each timed: plain, safe_gate (lower_bound -5; "
                                         "every input's g, ours too, clipped there)")
  compile_threads: int = _setting(1, "programs of one mixer and shape compiled at once before they are timed")
  breakdown: bool = _setting(False, "also list each run's kernels by device time (CUPTI, one warm run; GPU only)")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  configs: tuple[str, ...] = _setting(("experiments/configs/paper.py:kda_ref",), "config files, path.py:variant")
  remat: tuple[str, ...] = _setting((), "remat policies to time for every config (empty: each config's own)")
  peers: tuple[str, ...] = _setting(("kda",), "fla models timed at the first config's shape: kda, gdn, attention")
  overrides: tuple[str, ...] = _setting((), "model.field=value or train.field=value, applied to every config")
  batch: Optional[int] = _setting(None, "B (none: the config's data.batch_size)")
  seq_len: Optional[int] = _setting(None, "T (none: the config's data.seq_len)")
  steps: int = _setting(10, "timed steps per timer")
  warmup: int = _setting(2, "steps after the first (compiling) one before timing")
  log_every: int = _setting(10, "how often the training loop fetches metrics, as train.log_every")
  timeout: int = _setting(600, "seconds each entry's process may take")
  baseline: Optional[str] = _setting(None, "entry the ratios are taken against (none: 'fla <first peer>')")
  docs: tuple[int, ...] = _setting((0,), "documents per row, each config timed at each: 0 unpacked rows; n >= 2 "
                                   "packed rows of n documents at random boundaries (segment_ids and positions)")


@dataclasses.dataclass(frozen=True)
class SdmSettings:
  shapes: tuple[str, ...] = _setting(("4x4096",), "B x T of the SDM, dense GDN and row traffic runs")
  sdm_heads: int = _setting(2, "H of the SDM")
  num_slots: int = _setting(65536, "N, slots per SDM head (a perfect square: the addressing's sqrt(N) sub-keys)")
  value_dim: int = _setting(1024, "V of the SDM")
  topk: int = _setting(128, "W = R, slots written and read per token")
  gdn_heads: int = _setting(16, "H of the dense GDN run")
  gdn_head_dim: int = _setting(128, "K = V of the dense GDN run")
  address_rows: int = _setting(32768, "tokens of the addressing run (times sdm_heads rows)")
  address_dim: int = _setting(128, "sub-key dimension of the addressing run")
  impls: tuple[str, ...] = _setting(("chunk", "pallas"), "impls of the SDM op and of the dense GDN op")
  sdm_chunk_sizes: tuple[int, ...] = _setting((16,), "chunk sizes of the SDM chunk impl, each timed")
  gdn_chunk_size: int = _setting(32, "chunk size of the dense GDN op (32, as the op benchmarks run pallas)")
  reps: int = _setting(10, "warm runs per timing (median)")
  breakdown: bool = _setting(False, "also list the op's kernels by device time (CUPTI, one warm run; GPU only)")


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  variants: tuple[str, ...] = dataclasses.field(
      default_factory=lambda: (*_dense_mixers(), "sdm", "attention"),
      metadata={"help": "models: the dense mixers (pattern D), sdm (the SSSM hybrid), attention (the peer)"})
  batches: tuple[int, ...] = _setting((1, 32), "batch sizes")
  contexts: tuple[int, ...] = _setting((1024, 4096, 16384, 65536), "tokens in the cache when decoding starts")
  steps: int = _setting(64, "tokens decoded per timed run (one lax.scan)")
  reps: int = _setting(5, "timed runs per point (median), after one warm-up")
  width: int = _setting(512, "model width")
  layers: int = _setting(4, "layers of every model (a hybrid's pattern repeats to fill them)")
  heads: int = _setting(8, "heads of the dense mixers and attention")
  head_dim: int = _setting(64, "key and value dimension per head")
  vocab_size: int = _setting(256, "vocabulary size")
  overrides: tuple[str, ...] = _setting((), "field=value set on every model config, e.g. window=2048,dtype=bfloat16")
  seed: int = _setting(0, "seed of the random parameters")


@dataclasses.dataclass(frozen=True)
class SdmMemorySettings:
  entries: tuple[str, ...] = _setting(
      ("pallas", "pallas:bfloat16:1", "pallas:float32:1:bfloat16", "pallas:float32:2", "pallas:bfloat16:2",
       "pallas:float32:4", "pallas:bfloat16:4"),
      "impl[:rows_dtype:rows_segments[:table_dtype[:table_grad_dtype]]][@BVxWARPS/BVxWARPS] of sparse_delta_rule "
      "(scan, chunk or pallas; options and the token kernels' launch, forward/backward: pallas)")
  shape: str = _setting("4x4096", "B x T")
  heads: int = _setting(2, "H")
  num_slots: int = _setting(65536, "N, slots per head")
  value_dim: int = _setting(1024, "V")
  topk: int = _setting(128, "W = R, slots written and read per token")
  chunk_size: int = _setting(16, "chunk size of the chunk impl")
  reps: int = _setting(5, "timed runs of each entry's forward+backward (median)")
  compile_only: bool = _setting(False, "compile for abstract inputs only (nothing runs: GPU shapes on a CPU)")


@dataclasses.dataclass(frozen=True)
class PackedSettings:
  mixers: tuple[str, ...] = _setting(("kda", "gdn", "gdn2", "sdm"), "dense mixers of sdm_jax.ops.MIXERS, and sdm")
  shapes: tuple[str, ...] = _setting(("4x4096",), "B x T")
  docs: int = _setting(8, "documents per packed row (boundaries at random)")
  impl: str = _setting("pallas", "impl of every op")
  heads: int = _setting(16, "H of the dense ops")
  head_dim: int = _setting(128, "K = V of the dense ops")
  chunk_sizes: tuple[int, ...] = _setting((32, 64), "chunk sizes of the dense ops, each timed")
  dtype: str = _setting("bfloat16", "input dtype of the dense ops (g stays fp32)")
  sdm_heads: int = _setting(2, "H of the SDM")
  num_slots: int = _setting(65536, "N of the SDM")
  sdm_value_dim: int = _setting(1024, "V of the SDM")
  topk: int = _setting(128, "W = R of the SDM")
  sdm_options: tuple[str, ...] = _setting(("float32:1",),
                                          "rows_dtype:rows_segments[:table_dtype[:table_grad_dtype]] of the SDM op")
  reps: int = _setting(20, "runs per timing, for both clocks")
  breakdown: bool = _setting(False, "also list each run's kernels by device time, packed beside unpacked (CUPTI, "
                             "one warm run; GPU only)")


@dataclasses.dataclass(frozen=True)
class KernelsSettings:
  mixers: tuple[str, ...] = _setting(("gdn2",), "mixers whose inputs the kernels get (formed by mixer_inputs)")
  parts: tuple[str, ...] = _setting(("mixer_inputs", "chunk_cumsum", "intra_chunk", "state_pass", "state_pass_bwd",
                                     "intra_chunk_bwd"), "kernels to time")
  shapes: tuple[str, ...] = _setting(("4x4096",), "B x T")
  heads: int = _setting(16, "H")
  head_dim: int = _setting(128, "K = V")
  chunk_sizes: tuple[int, ...] = _setting((32,), "chunk sizes")
  dtype: str = _setting("bfloat16", "io dtype (g stays fp32)")
  grid: dict[str, tuple[int, ...]] = _setting(
      {}, "launch settings to sweep, grid.<kernel>.<field>=v1,v2 (their product; the rest keep their defaults)")
  reps: int = _setting(10, "warm runs per timing (median)")


@dataclasses.dataclass(frozen=True)
class Mode:
  """One entry of the registry. key: the record fields that name one measured point (how a --base run pairs the
  two trees' rows); compared: the lower-is-better record fields set side by side there; base_settings: settings of
  the base tree's run (the peer is the same code for both trees: timed once, in this tree's run); spawns: it
  times in processes of its own, which must find the device's memory free; env: environment variables set before
  JAX starts, given the settings."""
  name: str
  description: str
  settings: type
  cpu: dict
  module: str
  key: tuple[str, ...]
  compared: tuple[str, ...]
  base_settings: dict = dataclasses.field(default_factory=dict)
  spawns: bool = False
  env: Any = None


def _ops_env(settings):
  # torch allocates on the same GPU, so JAX takes half of it up front rather than its default 75%. Not
  # preallocating at all instead doubled KDA's forward+backward back to back (DESIGN.md section 7).
  return {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"} if settings.peer else {}


MODES = {entry.name: entry for entry in (
    Mode("ops", "the dense mixers' ops, forward and forward+backward, over shapes; fla's Triton kernels beside them",
         OpsSettings, {"shapes": ("1x256",), "heads": 2, "head_dim": 32, "reps": 3}, "sdm_jax.benchmarking.op_bench",
         key=("mixer", "impl", "chunk_size", "B", "T"),
         compared=("fwd_ms", "fwd_bwd_ms", "fwd_host_ms", "fwd_bwd_host_ms"),
         base_settings={"peer": False}, env=_ops_env),
    Mode("train", "whole-model training steps (ms/step, tokens/s, peak memory, MFU), one process per entry; fla's "
         "HF models beside them", TrainSettings,
         {"configs": ("experiments/configs/mqar.py:demo",), "steps": 3, "warmup": 1},
         "sdm_jax.benchmarking.train_bench", key=("name",),
         compared=("ms_per_step_loop", "ms_per_step_synced", "peak_bytes"), base_settings={"peers": ()}, spawns=True),
    Mode("sdm", "the Sparse Delta Memory op beside the dense GDN op at matching FLOPs, its row traffic alone, and "
         "product-key addressing", SdmSettings,
         {"shapes": ("1x64",), "num_slots": 1024, "value_dim": 32, "topk": 8, "gdn_heads": 2, "gdn_head_dim": 32,
          "address_rows": 256, "address_dim": 32}, "sdm_jax.benchmarking.sdm_bench", key=("what",),
         compared=("fwd_ms", "fwd_bwd_ms", "fwd_host_ms", "fwd_bwd_host_ms")),
    Mode("decode", "greedy decoding tokens/s and cache bytes per sequence of every mixer's model at long contexts, "
         "against full attention", DecodeSettings,
         {"contexts": (64, 256), "width": 64, "heads": 2, "head_dim": 32, "steps": 8, "reps": 2},
         "sdm_jax.benchmarking.decode_bench", key=("variant", "batch", "context"),
         compared=("ms_per_step", "temp_bytes")),
    Mode("sdm_memory", "the SDM op's training memory per impl and option (saved bytes, XLA's compiled memory; on a "
         "GPU the forward+backward time, the peak, the error against the first entry)", SdmMemorySettings,
         {"entries": ("chunk", "scan", "pallas", "pallas:bfloat16:1"), "shape": "1x64", "num_slots": 256,
          "value_dim": 16, "topk": 4, "compile_only": True}, "sdm_jax.benchmarking.sdm_memory", key=("entry",),
         compared=("saved_bytes", "temp_bytes", "fwd_bwd_ms", "peak_bytes")),
    Mode("packed", "what packing documents into rows (segment_ids) costs each op, forward and forward+backward, "
         "device and host clocks", PackedSettings,
         {"shapes": ("1x64",), "impl": "chunk", "heads": 2, "head_dim": 16, "chunk_sizes": (16,), "num_slots": 256,
          "sdm_value_dim": 16, "topk": 4, "reps": 3}, "sdm_jax.benchmarking.packed_bench",
         key=("mixer", "B", "T", "variant", "part"), compared=("unpacked_ms", "packed_ms")),
    Mode("kernels", "each Pallas kernel of the dense op alone, over launch settings (grid.<kernel>.<field>), with "
         "XLA's forms of the memory-bound ones", KernelsSettings,
         {"shapes": ("1x32",), "heads": 1, "head_dim": 16, "chunk_sizes": (16,), "reps": 2},
         "sdm_jax.benchmarking.kernel_bench", key=("mixer", "kernel", "B", "T", "chunk_size", "launch"),
         compared=("ms",)),
)}


def mode(what):
  """The registry's entry named `what`; ConfigError naming the modes otherwise."""
  if what not in MODES:
    raise ConfigError(f"what: expected one of {tuple(MODES)}, got {what!r}{close_names(what, MODES)}")
  return MODES[what]


def _parse(name, text, hint):
  """The setting `name` from its text, as its type hint says."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is typing.Union:  # Optional[x]
    if text.strip().lower() in ("none", ""):
      return None
    return _parse(name, text, next(a for a in args if a is not type(None)))
  if origin is tuple:
    return tuple(_parse(name, item.strip(), args[0]) for item in text.split(",") if item.strip())
  if hint is bool:
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
      raise ConfigError(f"{name}: expected true or false, got {text!r}")
    return text.lower() in ("true", "1", "yes")
  try:
    return hint(text)
  except ValueError:
    raise ConfigError(f"{name}: expected {hint.__name__ if hint is not str else 'text'}, got {text!r}") from None


def parse_overrides(what, items):
  """{setting: value} from "name=value" strings (a list comma-separated; grid.<kernel>.<field>=... for a dict
  setting), each checked against the mode's settings; a later item wins."""
  entry = mode(what)
  hints = typing.get_type_hints(entry.settings)
  values = {}
  for item in items:
    name, sep, text = item.partition("=")
    name = name.strip()
    field, _, sub = name.partition(".")
    if not sep or field not in hints:
      raise ConfigError(f"{what} setting {item!r}: expected name=value with a name of {tuple(hints)}"
                        f"{close_names(field, hints)}")
    hint = hints[field]
    if typing.get_origin(hint) is dict:
      if not sub:
        raise ConfigError(f"{what} setting {name}: expected {field}.<key>=value")
      values.setdefault(field, {})[sub] = _parse(name, text, typing.get_args(hint)[1])
    elif sub:
      raise ConfigError(f"{what} setting {name}: {field} has no fields")
    else:
      values[field] = _parse(name, text, hint)
  return values


def settings(what, overrides=(), backend=None):
  """The settings of mode `what`: its defaults, its CPU values where backend == "cpu", then `overrides`
  ("name=value" strings, `parse_overrides`)."""
  entry = mode(what)
  values = dict(entry.cpu) if backend == "cpu" else {}
  values.update(parse_overrides(what, overrides))
  return entry.settings(**values)


def _module(entry):
  return importlib.import_module(entry.module)


def check(what, overrides=(), backend=None):
  """settings(what, overrides, backend), held to the mode's own check of their values (ConfigError naming the
  setting)."""
  chosen = settings(what, overrides, backend)
  try:
    _module(mode(what)).check_settings(chosen)
  except ValueError as error:
    raise ConfigError(f"{what} setting {error}") from None
  return chosen


def _backend(spawns):
  """jax's default backend. A mode that times in processes of its own leaves them the device's memory: this
  process then starts JAX without taking memory up front (its children start with the environment as it was)."""
  import jax
  if not spawns:
    return jax.default_backend()
  before = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")
  os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  try:
    return jax.default_backend()
  finally:
    if before is None:
      del os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"]
    else:
      os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = before


# experiments.bench's exit code when it wrote its report but some entries hold an error: a tree's run with failed
# entries still gives its rows to a comparison of trees.
FAILED_ENTRIES_EXIT = 3


def bench(what, overrides=(), *, out_dir="runs/bench", tag=None, base=None, merge=(), log=print):
  """Times mode `what` with `overrides` ("name=value" strings) and writes its report; returns its paths.

  base: a git commit to time beside this tree in the same run (the module docstring). merge: instead of timing,
  the JSON reports of earlier runs of this mode, written as one report (modes whose module has `merge`).
  """
  entry = mode(what)
  tag = tag or what
  given = settings(what, overrides)  # the names and types; the values are checked with the backend's sizes
  if merge:
    module = _module(entry)
    if not hasattr(module, "merge"):
      raise ConfigError(f"merge: the {what} mode has no merge; the modes that do: "
                        f"{tuple(name for name, m in MODES.items() if hasattr(_module(m), 'merge'))}")
    return module.merge(list(merge), out_dir, tag, log=log)
  if base:
    return compare_trees(what, overrides, base, out_dir=out_dir, tag=tag, log=log)
  for name, value in (entry.env(given) if entry.env else {}).items():
    os.environ.setdefault(name, value)
  chosen = check(what, overrides, _backend(entry.spawns))
  return _module(entry).bench(chosen, out_dir, tag, log=log)[1]


def describe():
  """The registry as text: every mode, what it times, and its settings with their defaults (CPU values beside)."""
  lines = []
  for entry in MODES.values():
    lines += [f"{entry.name}: {entry.description}"]
    defaults = entry.settings()
    for field in dataclasses.fields(entry.settings):
      value = _text(getattr(defaults, field.name))
      cpu = f" (CPU: {_text(entry.cpu[field.name])})" if field.name in entry.cpu else ""
      lines.append(f"    {field.name}={value}{cpu}  {field.metadata.get('help', '')}")
  return "\n".join(lines)


def _text(value):
  if isinstance(value, tuple):
    return ",".join(str(v) for v in value)
  if isinstance(value, dict):
    return " ".join(f"{key}={_text(v)}" for key, v in value.items()) or "{}"
  return str(value)


def _git(*args, env=None):
  done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                        env=None if env is None else {**os.environ, **env})
  return done.stdout.strip() if done.returncode == 0 else None


def tree_name():
  """This tree, as its commit and whether it has uncommitted changes to tracked files. With changes, also the git
  tree hash of the files as they are (untracked ones not ignored included, through a scratch index): a copy of a
  working tree whose history is older than its files (the device tool's) then still names the commit whose tree it
  is (`git rev-parse <commit>^{tree}` prints the same hash)."""
  head = _git("rev-parse", "--short", "HEAD") or "?"
  if not _git("status", "--porcelain", "--untracked-files=no"):
    return head
  with tempfile.TemporaryDirectory() as scratch:
    env = {"GIT_INDEX_FILE": os.path.join(scratch, "index")}
    ok = _git("read-tree", "HEAD", env=env) is not None and _git("add", "-A", env=env) is not None
    tree = _git("write-tree", env=env) if ok else None
  return f"{head} with uncommitted changes" + (f" (tree {tree[:12]})" if tree else "")


def materialise(commit, dest):
  """Writes the tree of `commit` into dest (`git archive`) with this tree's HARNESS laid over it; returns
  '<short hash> <subject>' of the commit."""
  full = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
  if not full:
    raise ConfigError(f"base: expected a commit of the git repository at {ROOT}, got {commit!r}")
  with subprocess.Popen(["git", "archive", "--format=tar", full], cwd=ROOT, stdout=subprocess.PIPE) as archive:
    with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
      tar.extractall(dest, filter="data")
  if archive.returncode:
    raise RuntimeError(f"git archive {full} failed with exit code {archive.returncode}")
  for path in HARNESS:
    source, target = ROOT / path, pathlib.Path(dest) / path
    if source.is_dir():
      shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    else:
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(source, target)
  return _git("log", "-1", "--format=%h %<(60,trunc)%s", full).strip()


def _run_tree(tree, root, what, overrides, out_dir, tag, log):
  """Runs `python -m experiments.bench` for one tree in a process of its own; returns its report's JSON."""
  command = [sys.executable, "-m", "experiments.bench", f"--what={what}", f"--out_dir={out_dir}", f"--tag={tag}",
             *[f"--set={item}" for item in overrides]]
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
  log(f"== {tree} tree ({root}): {' '.join(command[1:])}")
  done = subprocess.run(command, cwd=root, env=env)
  reports = sorted(glob.glob(os.path.join(out_dir, f"*_{tag}.json")), key=os.path.getmtime)
  if done.returncode not in (0, FAILED_ENTRIES_EXIT) or not reports:
    why = f"exited with code {done.returncode}" if done.returncode else f"wrote no report to {out_dir}"
    raise RuntimeError(f"base: the {tree} tree's run {why}; its output is above")
  with open(reports[-1]) as f:
    return json.load(f)


def link_trees(records, entry):
  """Sets vs_base_<field> = base / this on each of this tree's records whose point the base tree also measured."""
  key = lambda r: tuple(json.dumps(r.get(k), sort_keys=True) for k in entry.key)
  base = {key(r): r for r in records if r["tree"] == "base"}
  for r in records:
    if r["tree"] != "this":
      continue
    other = base.get(key(r), {})
    for field in entry.compared:
      ours, theirs = r.get(field), other.get(field)
      r[f"vs_base_{field}"] = theirs / ours if ours and theirs else None


def _cell(value):
  if value is None:
    return "-"
  if isinstance(value, bool) or isinstance(value, str):
    return str(value)
  if isinstance(value, int):
    return f"{value:,}"
  if isinstance(value, float):
    return f"{value:.4g}"
  return json.dumps(value)


def compare_table(records, entry):
  """A markdown table of both trees' records: the key, the tree, the compared numbers and this tree's ratios."""
  ratios = [f"vs_base_{field}" for field in entry.compared]
  columns = [*entry.key, "tree", *entry.compared]
  lines = ["| " + " | ".join(columns + [f"vs base {field}" for field in entry.compared] + ["note"]) + " |",
           "|" + "---|" * (len(columns) + len(ratios) + 1)]
  for r in records:
    cells = [_cell(r.get(c)) for c in columns]
    cells += ["-" if r.get(c) is None else f"{r[c]:.2f}x" for c in ratios]
    lines.append("| " + " | ".join(cells + [str(r.get("error") or "")]) + " |")
  return "\n".join(lines)


def compare_trees(what, overrides, base, *, out_dir, tag, log=print):
  """Times mode `what` in this tree and in commit `base`, each in a process of its own, and writes one report of
  both (the module docstring); returns its paths."""
  from sdm_jax.benchmarking.timing import command_line, write_tables
  entry = mode(what)
  trees = {"this": tree_name()}
  runs = {}
  scratch = tempfile.mkdtemp(prefix="sdm_jax_base_")
  try:
    trees["base"] = materialise(base, scratch)
    extra = {"this": [], "base": [f"{name}={_text(value)}" for name, value in entry.base_settings.items()]}
    for tree, root in (("this", ROOT), ("base", pathlib.Path(scratch))):
      tree_dir = os.path.abspath(os.path.join(out_dir, f"{tag}_trees", tree))
      runs[tree] = _run_tree(tree, root, what, [*overrides, *extra[tree]], tree_dir, tag, log)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  # Each tree's rows in its own order, this tree's first: the pairs are read off the key columns.
  records = [{**r, "tree": tree} for tree in TREES for r in runs[tree]["results"]]
  link_trees(records, entry)
  meta = {k: v for k, v in runs["this"].items() if k != "results"}
  meta["command"] = command_line()
  meta["trees"] = trees
  meta["runs"] = {tree: {k: v for k, v in run.items() if k != "results"} for tree, run in runs.items()}
  notes = [f"- this: {trees['this']}; base: {trees['base']} (this tree's harness, {', '.join(HARNESS)}, over it)",
           f"- vs base = base / this (above 1: this tree is faster or smaller); each tree's own report: "
           f"{os.path.join(out_dir, tag + '_trees', '{this,base}')}"]
  notes += [f"- base run's settings beside this one's: {', '.join(extra['base'])}"] if extra["base"] else []
  notes += [f"- peer for {name}: {note}" for name, note in meta.get("peer", {}).items()]
  paths = write_tables(records, meta, out_dir, tag, f"{what}, this tree against {base}", notes,
                       compare_table(records, entry))
  log("\nwrote " + ", ".join(paths[ext] for ext in ("json", "md")) + "\n" + compare_table(records, entry))
  return {ext: paths[ext] for ext in ("json", "md")}
