"""The settings of the benchmark modes (`registry.MODES`): one frozen dataclass per mode, each field's default the
GPU measurement's (DESIGN.md section 7) with a line of help beside it, and the parser that reads "name=value"
strings into them by their type hints.
"""

import dataclasses
import typing
from typing import Optional

from sdm_jax.training.config import ConfigError, close_names


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
  bounded: bool = _setting(False, "also time ours given that bound (lower_bound; g clipped there) where the impl uses "
                           "it (pallas)")
  compile_threads: int = _setting(1, "programs of one mixer and shape compiled at once before they are timed")
  breakdown: bool = _setting(False, "also list each run's kernels by device time (CUPTI, one warm run; GPU only)")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  configs: tuple[str, ...] = _setting(("experiments/configs/paper.py:kda_ref",), "config files, path.py:variant")
  remat: tuple[str, ...] = _setting((), "remat policies to time for every config (empty: each config's own)")
  peers: tuple[str, ...] = _setting(("kda",), "fla models timed at the first config's shape: kda, kda_safe_gate, "
                                    "gdn, attention")
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
  mixers: tuple[str, ...] = _setting(("gdn2",), "mixers whose inputs the dense kernels get (formed by mixer_inputs)")
  parts: tuple[str, ...] = _setting((), "kernels to time, of kernel_bench.KERNELS (none: all of them)")
  shapes: tuple[str, ...] = _setting(("4x4096",), "B x T")
  heads: int = _setting(16, "H")
  head_dim: int = _setting(128, "K = V")
  chunk_sizes: tuple[int, ...] = _setting((32,), "chunk sizes of the dense kernels")
  dtype: str = _setting("bfloat16", "io dtype (g stays fp32)")
  num_slots: int = _setting(65536, "N of the SDM kernels (a perfect square: sqrt(N) sub-keys a half for addressing)")
  topk: int = _setting(128, "W = R of the SDM kernels, k of addressing")
  candidates: bool = _setting(False, "time each kernel's candidate launches (its settings' candidates) instead of its "
                              "defaults")
  grid: dict[str, tuple[int, ...]] = _setting(
      {}, "launch settings to sweep, grid.<kernel>.<field>=v1,v2 (their product; the rest keep their defaults)")
  reps: int = _setting(10, "warm runs per timing (median)")
  lower_bound: Optional[float] = _setting(None, "the dense per-chunk kernels given this lower_bound (the op's; g "
                                          "clipped there; per-channel mixers only)")


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


def parse_overrides(schema, items, what):
  """{setting: value} from "name=value" strings (a list comma-separated; grid.<kernel>.<field>=... for a dict
  setting), each checked against `schema`, the settings dataclass of mode `what`; a later item wins."""
  hints = typing.get_type_hints(schema)
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


def as_text(value):
  """A setting's value as it is written on the command line ("name=<this>"): a list comma-separated."""
  if isinstance(value, tuple):
    return ",".join(str(v) for v in value)
  if isinstance(value, dict):
    return " ".join(f"{key}={as_text(v)}" for key, v in value.items()) or "{}"
  return str(value)


def help_lines(schema, cpu):
  """One line per setting of `schema`: name=default, the value `cpu` gives it on a CPU backend, and its help."""
  defaults = schema()
  lines = []
  for field in dataclasses.fields(schema):
    shrunk = f" (CPU: {as_text(cpu[field.name])})" if field.name in cpu else ""
    lines.append(f"    {field.name}={as_text(getattr(defaults, field.name))}{shrunk}  {field.metadata.get('help', '')}")
  return lines
