"""The one registry of what can be timed: `MODES`, each a name, one line on what it times, its settings and the
library module that times it and writes its report. `experiments/bench.py` is its command line.

Settings are a frozen dataclass per mode (`settings.py`): the defaults are the GPU measurement's (DESIGN.md section
7), `Mode.cpu` holds the ones that shrink on a CPU backend, and `settings(what, overrides, backend)` applies them,
then the "name=value" overrides. A mode's module has `bench(settings, out_dir, tag, log)`, which measures, writes
<out_dir>/<date>_<tag>.{json,md[,png]} (`tables.write_tables`, after every point where a point is slow) and returns
(records, paths), and `check_settings(settings)`, which raises ValueError for settings that cannot run. The modules
are imported only when their mode runs. `bench(..., base=<commit>)` times the same mode in another tree beside this
one (`trees.py`).
"""

import dataclasses
import importlib
import os
from typing import Any

from sdm_jax.benchmarking.settings import (DecodeSettings, KernelsSettings, OpsSettings, PackedSettings,
                                           SdmMemorySettings, SdmSettings, TrainSettings, help_lines,
                                           parse_overrides)
from sdm_jax.benchmarking.trees import compare_trees
from sdm_jax.training.config import ConfigError, close_names


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
         key=("mixer", "impl", "chunk_size", "lower_bound", "B", "T"),
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
    Mode("kernels", "each Pallas kernel alone (kernel_bench.KERNELS: the dense op's, the SDM's, addressing), at its "
         "default launch, its candidates or a grid (grid.<kernel>.<field>), with XLA's forms of the memory-bound ones",
         KernelsSettings,
         {"shapes": ("1x32",), "heads": 1, "head_dim": 16, "chunk_sizes": (16,), "num_slots": 256, "topk": 16,
          "reps": 2},
         "sdm_jax.benchmarking.kernel_bench", key=("mixer", "kernel", "B", "T", "chunk_size", "launch"),
         compared=("ms",)),
)}


def mode(what):
  """The registry's entry named `what`; ConfigError naming the modes otherwise."""
  if what not in MODES:
    raise ConfigError(f"what: expected one of {tuple(MODES)}, got {what!r}{close_names(what, MODES)}")
  return MODES[what]


def settings(what, overrides=(), backend=None):
  """The settings of mode `what`: its defaults, its CPU values where backend == "cpu", then `overrides`
  ("name=value" strings, `parse_overrides`)."""
  entry = mode(what)
  values = dict(entry.cpu) if backend == "cpu" else {}
  values.update(parse_overrides(entry.settings, overrides, what))
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


def bench(what, overrides=(), *, out_dir="runs/bench", tag=None, base=None, merge=(), log=print):
  """Times mode `what` with `overrides` ("name=value" strings) and writes its report; returns its paths.

  base: a git commit to time beside this tree in the same run (`trees.py`). merge: instead of timing,
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
    return compare_trees(entry, overrides, base, out_dir=out_dir, tag=tag, log=log)
  for name, value in (entry.env(given) if entry.env else {}).items():
    os.environ.setdefault(name, value)
  chosen = check(what, overrides, _backend(entry.spawns))
  return _module(entry).bench(chosen, out_dir, tag, log=log)[1]


def describe():
  """The registry as text: every mode, what it times, and its settings with their defaults (CPU values beside)."""
  return "\n".join(line for entry in MODES.values()
                   for line in [f"{entry.name}: {entry.description}", *help_lines(entry.settings, entry.cpu)])
