"""Each Pallas kernel of the dense op (impl="pallas") alone, over launch settings: the registry's `kernels` mode.

The kernels are `pallas_kernels`' public launches, each with its settings dataclass: `mixer_inputs`
(`MixerInputsSettings`) beside XLA's `reference_inputs`, `chunk_cumsum` (`ChunkCumsumSettings`) beside XLA's cumsum
(the memory-bound launches in front of the chunk kernels, each with its byte floor at BANDWIDTH), `intra_chunk`
(`IntraChunkSettings`, with the saved inverse, as the training forward runs it), `state_pass` without and with the
states saved (`StatePassSettings`), `state_pass_bwd` (`StatePassBwdSettings`) and `intra_chunk_bwd`
(`IntraChunkBwdSettings`). A launch is the library's default settings with the fields of a grid point replaced:
grid {"<kernel>.<field>": values} sweeps the product of its fields' values per kernel (block_v and num_stages of the
state passes go through their shape rule, so the stages follow block_v as the library's do).

Inputs: the mixer's op inputs (`testing.inputs.make_op_inputs`, K = V, no initial state), formed into q, u, e, z as the
op forms them (`reference_inputs`; a per-head decay as [B, T, H], which every kernel reads as one decay per row);
each kernel after the first reads what the one before it wrote (default settings). Median of `reps` warm runs over
3 rotated input sets where the kernel reads inputs (`timing.median_ms`: the kernel's device time on the GPU), over
one set for the backward kernels. Off the GPU the kernels run in interpret mode (a smoke test: use small shapes).
"""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.delta_rule_bwd import IntraChunkBwdSettings, StatePassBwdSettings, intra_chunk_bwd, state_pass_bwd
from pallas_kernels.delta_rule_fwd import (ChunkCumsumSettings, IntraChunkSettings, StatePassSettings, chunk_cumsum,
                                           intra_chunk, state_pass)
from pallas_kernels.launch import Shape
from pallas_kernels.mixer_inputs import MixerInputsSettings, mixer_inputs
from sdm_jax.ops.inputs import reference_inputs
from sdm_jax import ops
from sdm_jax.benchmarking.op_bench import parse_shapes
from sdm_jax.benchmarking.tables import Column, table, write_tables
from sdm_jax.benchmarking.timing import compile_timed, error_text, median_ms, run_metadata
from sdm_jax.ops.validation import on_gpu
from sdm_jax.testing.inputs import make_op_inputs

INPUT_SETS = 3
# The H200's HBM bandwidth: the byte floor of a memory-bound launch is its bytes moved at this rate.
BANDWIDTH = 4.8e12
SETTINGS = {"mixer_inputs": MixerInputsSettings, "chunk_cumsum": ChunkCumsumSettings,
            "intra_chunk": IntraChunkSettings, "state_pass": StatePassSettings,
            "state_pass_bwd": StatePassBwdSettings, "intra_chunk_bwd": IntraChunkBwdSettings}
PARTS = tuple(SETTINGS)


def launch_settings(kernel, chunk_size, B, H, K, V, dtype, **fields):
  """The library's default settings of `kernel` for this shape with `fields` replaced."""
  cls = SETTINGS[kernel]
  if kernel in ("state_pass", "state_pass_bwd"):
    rule = {name: fields.pop(name) for name in ("block_v", "num_stages") if name in fields}
    default = cls.defaults(Shape(B=B, H=H, K=K, V=V, dtype=jnp.dtype(dtype).name, chunk_size=chunk_size), **rule)
  elif kernel in ("intra_chunk", "intra_chunk_bwd"):
    default = cls.defaults(Shape(chunk_size=chunk_size))
  else:
    default = cls.defaults()
  return dataclasses.replace(default, **fields)


def grid_points(kernel, grid):
  """[{field: value}] of `kernel`'s part of grid ({"<kernel>.<field>": values}); [{}] (the defaults) when none."""
  fields = {name.split(".", 1)[1]: values for name, values in grid.items() if name.split(".", 1)[0] == kernel}
  return [dict(zip(fields, values)) for values in itertools.product(*fields.values())]


def formed_inputs(mixer, B, T, H, K, dtype, seed):
  """{raw: (q, k, v, *gates), formed: (q, u, e, z) in dtype, g: [B, T, H, K] fp32 ([B, T, H] for a mixer with one
  decay per head, as the kernels read it), build}."""
  spec = ops.MIXERS[mixer]
  _, args = make_op_inputs(mixer, B, T, H, K, K, dtype, seed, initial_state=False)
  raw = (args["q"], args["k"], args["v"], *[args[name] for name, _ in spec.gates])
  formed = reference_inputs(spec.build, True, jnp.dtype(dtype), *raw)
  return {"raw": raw, "formed": formed, "g": args["g"].astype(jnp.float32), "build": spec.build}


def _bytes(*trees):
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(trees))


def sweep(mixer, B, T, H, K, chunk_size, dtype, *, parts=PARTS, grid=None, reps=10, log=print):
  """The records of every (kernel, launch) of `parts` for one mixer, shape and chunk size."""
  grid = grid or {}
  C, V, scale, interpret = chunk_size, K, K**-0.5, not on_gpu()
  sets = [formed_inputs(mixer, B, T, H, K, dtype, 10 * i) for i in range(INPUT_SETS)]
  build = sets[0]["build"]
  io = jnp.dtype(dtype)
  base = {"mixer": mixer, "B": B, "T": T, "H": H, "K": K, "chunk_size": C}
  records = []
  # The compiled launch at the library's default settings, where one was timed: it makes the next kernel's inputs.
  defaults = {}

  def timed(kernel, launch, fn, arg_sets, floor_bytes=None, settings=None):
    log(f"{mixer} {B}x{T} C={C} {kernel} {launch}: compiling and timing...")
    record = {**base, "kernel": kernel, "launch": launch, "settings": settings and dataclasses.asdict(settings),
              "floor_ms": None if floor_bytes is None else floor_bytes / BANDWIDTH * 1e3, "error": None}
    try:
      compiled, record["compile_s"] = compile_timed(fn, *arg_sets[0])
      record["ms"] = median_ms(compiled, arg_sets, reps)
      if launch == "default":
        defaults[kernel] = compiled
    except Exception as error:  # a launch that does not compile or fit is a result
      record["error"] = error_text(error)
      log(f"  failed: {record['error']}")
    records.append(record)

  def each(kernel, run):
    for point in grid_points(kernel, grid):
      settings = launch_settings(kernel, C, B, H, K, V, io, **point)
      run(settings, " ".join(f"{name}={value}" for name, value in point.items()) or "default")

  def made(kernel, fallback):
    return defaults.get(kernel, fallback)

  raw_sets = [s["raw"] for s in sets]
  if "mixer_inputs" in parts:
    floor = _bytes(raw_sets[0], sets[0]["formed"])
    timed("reference_inputs", "XLA", lambda *a: reference_inputs(build, True, io, *a), raw_sets, floor)
    each("mixer_inputs", lambda s, launch: timed(
        "mixer_inputs", launch, lambda *a: mixer_inputs(build, True, io, *a, settings=s, interpret=interpret),
        raw_sets, floor, s))
  g_sets = [(s["g"],) for s in sets]
  if "chunk_cumsum" in parts:
    floor = 2 * _bytes(g_sets[0])
    xla = lambda g: jnp.cumsum(g.reshape(B, T // C, C, *g.shape[2:]), axis=2).reshape(g.shape)
    timed("cumsum", "XLA", xla, g_sets, floor)
    each("chunk_cumsum", lambda s, launch: timed(
        "chunk_cumsum", launch, lambda g: chunk_cumsum(g, C, interpret, settings=s), g_sets, None, s))
  if not set(parts) - {"mixer_inputs", "chunk_cumsum"}:
    return records
  kw = dict(chunk_size=C, interpret=interpret)
  cumsum = made("chunk_cumsum", lambda g: chunk_cumsum(g, C, interpret))
  chunk_sets = [(s["formed"][0], (s["formed"][1], s["formed"][3], s["formed"][2]), cumsum(s["g"])) for s in sets]
  forward = lambda *a, **more: intra_chunk(*a, save_inverse=True, scale=scale, **kw, **more)
  if "intra_chunk" in parts:
    each("intra_chunk", lambda s, launch: timed(
        "intra_chunk save_inverse", launch, lambda *a: forward(*a, settings=s), chunk_sets, None, s))
  if not {"state_pass", "state_pass_bwd", "intra_chunk_bwd"} & set(parts):
    return records
  h0 = jnp.zeros((B, H, K, V), jnp.float32)
  chunks = [(made("intra_chunk save_inverse", forward)(*a), h0) for a in chunk_sets]
  if "state_pass" in parts:
    for save in (False, True):
      each("state_pass", lambda s, launch, save=save: timed(
          "state_pass" + (" save_states" if save else ""), launch,
          lambda *a: state_pass(*a, settings=s, save_states=save, **kw), chunks, None, s))
  q, (u, z, e), G = chunk_sets[0]
  tensors = chunks[0][0]
  del chunks
  o, final, states, r = made("state_pass save_states", lambda *a: state_pass(*a, save_states=True, **kw))(tensors, h0)
  d_o = jnp.asarray(np.random.default_rng(9).standard_normal(o.shape), io)
  d_final = jnp.zeros_like(final)
  if "state_pass_bwd" in parts:
    each("state_pass_bwd", lambda s, launch: timed(
        "state_pass_bwd", launch, lambda *a: state_pass_bwd(*a, settings=s, **kw), [(tensors, d_o, d_final)], None,
        s))
  if "intra_chunk_bwd" in parts:
    d_r, _, d_states = made("state_pass_bwd", lambda *a: state_pass_bwd(*a, **kw))(tensors, d_o, d_final)
    bwd_args = [(q, u, e, z, G, r, tensors.A, states, d_states, d_o, d_r)]
    each("intra_chunk_bwd", lambda s, launch: timed(
        "intra_chunk_bwd", launch, lambda *a: intra_chunk_bwd(*a, settings=s, scale=scale, **kw), bwd_args, None, s))
  return records


def format_table(records):
  """A markdown table: one row per (mixer, shape, chunk size, kernel, launch)."""
  return table([Column("mixer", "mixer"), Column("B x T", lambda r: f"{r['B']}x{r['T']}"),
                Column("C", "chunk_size", "d"), Column("kernel", "kernel"), Column("launch", "launch"),
                Column("compile s", "compile_s", ".1f"), Column("ms", "ms", ".3f"),
                Column("floor ms", "floor_ms", ".3f"), Column("note", lambda r: r["error"] or "")], records)


def check_settings(settings):
  """ValueError naming the setting unless `settings` (registry.KernelsSettings) can run."""
  s = settings
  if not s.mixers or any(m not in ops.MIXERS for m in s.mixers):
    raise ValueError(f"mixers: expected some of {tuple(ops.MIXERS)}, got {list(s.mixers)}")
  if not s.parts or any(p not in PARTS for p in s.parts):
    raise ValueError(f"parts: expected some of {PARTS}, got {list(s.parts)}")
  if s.head_dim < 16 or s.head_dim & (s.head_dim - 1):
    raise ValueError(f"head_dim: expected a power of two >= 16 (Triton blocks), got {s.head_dim}")
  for B, T in parse_shapes(",".join(s.shapes)):
    bad = [C for C in s.chunk_sizes if T % C]
    if bad:
      raise ValueError(f"chunk_sizes: the kernels take whole chunks: {bad} do not divide T = {T}")
  for name, values in s.grid.items():
    kernel, _, field = name.partition(".")
    if kernel not in SETTINGS:
      raise ValueError(f"grid.{name}: expected grid.<kernel>.<field> with a kernel of {PARTS}")
    fields = [f.name for f in dataclasses.fields(SETTINGS[kernel])]
    if field not in fields or not values:
      raise ValueError(f"grid.{name}: expected a field of {kernel}'s settings {tuple(fields)} and values")


def bench(settings, out_dir, tag, log=print):
  """The `kernels` mode over `settings` (registry.KernelsSettings), the report rewritten after every chunk size;
  returns (records, paths)."""
  s = settings
  meta = {**run_metadata(), "config": dataclasses.asdict(s)}
  notes = [f"- H={s.heads} K=V={s.head_dim} {s.dtype}; median of {s.reps} warm runs; floor: the launch's bytes at "
           f"{BANDWIDTH / 1e12:.1f} TB/s"]
  records = []
  for B, T in parse_shapes(",".join(s.shapes)):
    for mixer in s.mixers:
      for C in s.chunk_sizes:
        records += sweep(mixer, B, T, s.heads, s.head_dim, C, s.dtype, parts=s.parts, grid=s.grid, reps=s.reps,
                         log=log)
        paths = write_tables(records, meta, out_dir, tag, "Pallas kernels", notes, format_table(records))
  log(f"\nwrote {paths['json']}, {paths['md']}\n" + format_table(records))
  return records, {ext: paths[ext] for ext in ("json", "md")}
