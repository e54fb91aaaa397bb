"""Each Pallas kernel alone, over launch settings: the registry's `kernels` mode, which times the entries of `KERNELS`.

`KERNELS` names each public launch of `pallas_kernels` once: how to make its inputs at a `Point`, how to run it with
given launch settings, and its settings class (`pallas_kernels.launch.LaunchSettings`). The dense op's kernels, in
the order impl="pallas" runs them: `mixer_inputs` beside XLA's `reference_inputs` and `chunk_cumsum` beside XLA's
cumsum (the memory-bound launches in front of the chunk kernels, each with its byte floor at BANDWIDTH),
`intra_chunk` (with the saved inverse, as the training forward runs it), `state_pass` without and with the states
saved, `state_pass_bwd` and `intra_chunk_bwd`; then the Sparse Delta Memory's token kernels, `sparse_tokens_fwd`
(without and with the rows saved) and `sparse_tokens_bwd`, and product-key addressing, `product_key_address`.

A launch is the kernel's `defaults` at the point's shape; with candidates=true each of its settings' `candidates`;
a grid {"<kernel>.<field>": values} sets the product of its fields' values on the defaults (`launch.settings_at`: a
field the rule reads, the state passes' block_v, goes through the rule, so the stages follow it as the library's
do).

Inputs: the dense kernels get a mixer's op inputs (`testing.inputs.make_op_inputs`, K = V, no initial state), formed
into q, u, e, z as the op forms them (`reference_inputs`; a per-head decay as [B, T, H], which every kernel reads as
one decay per row), a point per mixer and chunk size; each kernel after the first reads what the one before it wrote
(default settings). The SDM kernels get `testing.inputs.sdm_inputs` (H heads of V values, N slots, W = R slots a
token, each entry's weight its slot's as with the layer's distinct slots), the table broadcast from m0 in the launch
as the op does; addressing gets fp32 queries of K channels and sub-key tables of sqrt(N) rows (the layer's dtypes
promote to fp32). Operands a kernel writes in place are copied first (not donated), which the time includes. Median
of `reps` warm runs over 3 rotated input sets (`timing.median_ms`: the kernel's device time on the GPU), over one set
for the backward kernels. Off the GPU the kernels run in interpret mode (a smoke test: use small shapes).
"""

import dataclasses
import functools
import itertools
import math
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.chunk_math import check_lower_bound
from pallas_kernels.delta_rule_bwd import IntraChunkBwdSettings, StatePassBwdSettings, intra_chunk_bwd, state_pass_bwd
from pallas_kernels.delta_rule_fwd import (ChunkCumsumSettings, IntraChunkSettings, StatePassSettings, chunk_cumsum,
                                           intra_chunk, state_pass)
from pallas_kernels.launch import Shape, field_names, settings_at
from pallas_kernels.mixer_inputs import MixerInputsSettings, mixer_inputs
from pallas_kernels.product_key import ProductKeySettings, product_key_address
from pallas_kernels.sparse_tokens import Launch, sparse_tokens_bwd, sparse_tokens_fwd
from sdm_jax import ops
from sdm_jax.benchmarking.op_bench import parse_shapes
from sdm_jax.benchmarking.tables import Column, table, write_tables
from sdm_jax.benchmarking.timing import compile_timed, error_text, median_ms, run_metadata
from sdm_jax.ops.inputs import reference_inputs
from sdm_jax.ops.product_key import rank_pairs
from sdm_jax.ops.sparse_pallas import read_at_writes
from sdm_jax.ops.validation import on_gpu
from sdm_jax.testing.inputs import make_op_inputs, sdm_inputs

INPUT_SETS = 3
# The H200's HBM bandwidth: the byte floor of a memory-bound launch is its bytes moved at this rate.
BANDWIDTH = 4.8e12


class Point(NamedTuple):
  """One measured point: mixer, the dense mixer whose inputs a dense kernel gets (None for the others), shape,
  the `pallas_kernels.launch.Shape` the inputs are made at and the launch rules read, and lower_bound: None, or the
  bound the per-chunk kernels are given (the op's lower_bound), g clipped there."""
  mixer: Optional[str]
  shape: Shape
  lower_bound: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One Pallas launch the kernels mode times: an entry of `KERNELS`.

  settings: its launch settings class (`pallas_kernels.launch.LaunchSettings`).
  inputs(point, seed, made) -> {name: array or pytree of arrays}: its arguments at point, drawn from seed; made is a
    dict the kernels of one point share, where an entry keeps what it formed once (what an earlier kernel wrote) for
    the entries after it.
  run(point, settings, interpret, **variant) -> fn(**inputs): one launch with those settings.
  variants: {record name: keyword arguments of run}, a record each (None: one, named as the entry).
  reference: (record name, fn(point) -> fn(**inputs)), XLA's form of the same work, timed beside the kernel.
  memory_bound: its records carry the byte floor, its inputs read and outputs written at BANDWIDTH.
  per_mixer: its inputs are a dense mixer's (a point per mixer and chunk size; else a point per shape).
  input_sets: how many rotated input sets it is timed over (fewer for the backward's large inputs)."""
  settings: type
  inputs: Callable
  run: Callable
  variants: Optional[dict] = None
  reference: Optional[tuple] = None
  memory_bound: bool = False
  per_mixer: bool = False
  input_sets: int = INPUT_SETS


def _once(made, key, make):
  """made[key], made by make() when first asked for."""
  if key not in made:
    made[key] = make()
  return made[key]


def _interpret():
  return not on_gpu()


# The dense op's kernels.

def _mixer_arrays(point, seed, made):
  """{raw: (q, k, v, *gates), formed: (q, u, e, z) in the io dtype, g: fp32 ([B, T, H] for a mixer with one decay
  per head, as the kernels read it)} of the point's mixer."""
  def make():
    s, spec = point.shape, ops.MIXERS[point.mixer]
    _, args = make_op_inputs(point.mixer, s.B, s.T, s.H, s.K, s.V, s.dtype, seed, initial_state=False)
    raw = (args["q"], args["k"], args["v"], *[args[name] for name, _ in spec.gates])
    g = args["g"].astype(jnp.float32)
    return {"raw": raw, "formed": reference_inputs(spec.build, True, jnp.dtype(s.dtype), *raw),
            "g": g if point.lower_bound is None else jnp.maximum(g, point.lower_bound)}
  return _once(made, ("mixer", seed), make)


def _forming_inputs(point, seed, made):
  q, k, v, *gates = _mixer_arrays(point, seed, made)["raw"]
  return {"q": q, "k": k, "v": v, "gates": tuple(gates)}


def _forming(kernel):
  """fn(point) -> fn(q, k, v, gates, **launch) -> (q, u, e, z): the point's mixer's forming by kernel
  (`mixer_inputs` or XLA's `reference_inputs`)."""
  def at(point):
    build, io = ops.MIXERS[point.mixer].build, jnp.dtype(point.shape.dtype)
    return lambda q, k, v, gates, **launch: kernel(build, True, io, q, k, v, *gates, **launch)
  return at


def _mixer_inputs(point, settings, interpret):
  return functools.partial(_forming(mixer_inputs)(point), settings=settings, interpret=interpret)


def _cumsum_inputs(point, seed, made):
  return {"g": _mixer_arrays(point, seed, made)["g"]}


def _chunk_cumsum(point, settings, interpret):
  return functools.partial(chunk_cumsum, chunk_size=point.shape.chunk_size, interpret=interpret, settings=settings)


def _xla_cumsum(point):
  C = point.shape.chunk_size
  return lambda g: jnp.cumsum(g.reshape(g.shape[0], -1, C, *g.shape[2:]), axis=2).reshape(g.shape)


def _chunk_inputs(point, seed, made):
  """intra_chunk's inputs: q, (u, z, e) and G, the chunk cumsum of g."""
  q, u, e, z = _mixer_arrays(point, seed, made)["formed"]
  G = _once(made, ("G", seed), lambda: chunk_cumsum(_cumsum_inputs(point, seed, made)["g"], point.shape.chunk_size,
                                                     _interpret()))
  return {"q": q, "arrays": (u, z, e), "G": G}


def _chunk_kernel(kernel, *, scaled=False, **options):
  """run of a per-chunk or state-pass kernel: kernel(**inputs) at the point's chunk size (scaled: and the op's scale,
  K^-1/2, and lower_bound, the point's: the kernels that form the grams)."""
  def run(point, settings, interpret, **variant):
    scale = {"scale": point.shape.K**-0.5, "lower_bound": point.lower_bound} if scaled else {}
    return functools.partial(kernel, chunk_size=point.shape.chunk_size, settings=settings, interpret=interpret,
                             **scale, **options, **variant)
  return run


def _state_inputs(point, seed, made):
  """state_pass's inputs: the `ChunkTensors` of intra_chunk with the saved inverse, and a zero initial state."""
  s = point.shape
  chunks = _once(made, ("chunks", seed), lambda: KERNELS["intra_chunk"].run(point, None, _interpret())(
      **_chunk_inputs(point, seed, made)))
  return {"chunks": chunks, "initial_state": jnp.zeros((s.B, s.H, s.K, s.V), jnp.float32)}


def _state_bwd_inputs(point, seed, made):
  """state_pass_bwd's inputs: the chunk tensors, a random d_o and a zero d_final_state."""
  s = point.shape
  chunks = _state_inputs(point, seed, made)["chunks"]
  d_o = jnp.asarray(np.random.default_rng(9).standard_normal(chunks.U.shape), chunks.U.dtype)
  return {"chunks": chunks, "d_o": d_o, "d_final_state": jnp.zeros((s.B, s.H, s.K, s.V), jnp.float32)}


def _intra_chunk_bwd_inputs(point, seed, made):
  """intra_chunk_bwd's inputs: the formed inputs, G, what the states pass saves (the states and R) and what the
  backward states pass gives (dR and the states' cotangents)."""
  state_inputs = _state_inputs(point, seed, made)
  _, _, states, r = KERNELS["state_pass"].run(point, None, _interpret(), save_states=True)(**state_inputs)
  bwd_inputs = _state_bwd_inputs(point, seed, made)
  d_r, _, d_states = KERNELS["state_pass_bwd"].run(point, None, _interpret())(**bwd_inputs)
  chunk_inputs = _chunk_inputs(point, seed, made)
  u, z, e = chunk_inputs["arrays"]
  return {"q": chunk_inputs["q"], "u": u, "e": e, "z": z, "G": chunk_inputs["G"], "r": r,
          "A": state_inputs["chunks"].A, "states": states, "d_states": d_states, "d_o": bwd_inputs["d_o"], "d_r": d_r}


# The Sparse Delta Memory's kernels.

def _heads(x):  # [B, T, H, ...] -> [B, H, T, ...], the token kernels' layout
  return jnp.moveaxis(x, 2, 1)


def _token_inputs(point, seed, made):
  """sparse_tokens_fwd's per-token inputs ([B, H, T, ...]) and m0 [H, N, V]."""
  def make():
    s = point.shape
    floats, ints = sdm_inputs(s.B, s.T, s.H, s.N, s.V, s.W, s.W, seed)
    per_token = dict(k_idx=ints["k_idx"], k_w=floats["k_w"], k_slot=floats["k_w"], decay=jnp.exp(floats["g"]),
                     beta=floats["beta"], v=floats["v"], q_idx=ints["q_idx"], q_w=floats["q_w"])
    return {"m0": floats["m0"], **{name: _heads(x) for name, x in per_token.items()}}
  return _once(made, ("tokens", seed), make)


def _tokens_fwd(point, settings, interpret, save_rows=False):
  """The op's forward launch: the batch's fp32 table broadcast from m0, then the kernel."""
  def fn(m0, **per_token):
    table = jnp.broadcast_to(m0, (point.shape.B, *m0.shape))
    return sparse_tokens_fwd(table, **per_token, save_rows=save_rows, **settings._asdict(), interpret=interpret)
  return fn


def _tokens_bwd_inputs(point, seed, made):
  """sparse_tokens_bwd's inputs after the forward that saves the rows: the final table, the rows, the per-token
  arrays (k_first 1 and q_slot the read weights, as with distinct slots) and a random d_o."""
  x = dict(_token_inputs(point, seed, made))
  table, o, rows = _tokens_fwd(point, Launch.defaults(), _interpret(), save_rows=True)(**x)
  del x["m0"], x["q_w"]
  d_o = jnp.asarray(np.random.default_rng(9).standard_normal(o.shape), o.dtype)
  q_slot = _token_inputs(point, seed, made)["q_w"]
  return {"table": table, **x, "k_first": jnp.ones_like(x["k_w"]), "q_slot": q_slot,
          "k_read": read_at_writes(x["k_idx"], x["q_idx"], q_slot, distinct=True), "rows": rows, "d_o": d_o}


def _tokens_bwd(point, settings, interpret):
  """The op's backward launch: dM of the final table zeros (nothing reads the table after the layer), then the
  kernel."""
  def fn(table, **arrays):
    return sparse_tokens_bwd(table, jnp.zeros(table.shape, jnp.float32), **arrays, **settings._asdict(),
                             interpret=interpret)
  return fn


def _address_inputs(point, seed, made):
  """Query halves x1, x2 [B T, H, K] and sub-key tables c1, c2 [H, sqrt(N), K], N(0, 1) in fp32."""
  s = point.shape
  n, rng = math.isqrt(s.N), np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32))
  return {"x1": normal(s.B * s.T, s.H, s.K), "x2": normal(s.B * s.T, s.H, s.K), "c1": normal(s.H, n, s.K),
          "c2": normal(s.H, n, s.K)}


def _address(point, settings, interpret):
  k, n = point.shape.W, math.isqrt(point.shape.N)
  return functools.partial(product_key_address, k=k, rank_pairs=rank_pairs(k, n), settings=settings,
                           interpret=interpret)


KERNELS = {
    "mixer_inputs": Kernel(MixerInputsSettings, _forming_inputs, _mixer_inputs, memory_bound=True,
                           reference=("reference_inputs", _forming(reference_inputs)), per_mixer=True),
    "chunk_cumsum": Kernel(ChunkCumsumSettings, _cumsum_inputs, _chunk_cumsum, memory_bound=True,
                           reference=("cumsum", _xla_cumsum), per_mixer=True),
    "intra_chunk": Kernel(IntraChunkSettings, _chunk_inputs, _chunk_kernel(intra_chunk, scaled=True,
                                                                           save_inverse=True),
                          variants={"intra_chunk save_inverse": {}}, per_mixer=True),
    "state_pass": Kernel(StatePassSettings, _state_inputs, _chunk_kernel(state_pass),
                         variants={"state_pass": {}, "state_pass save_states": {"save_states": True}}, per_mixer=True),
    "state_pass_bwd": Kernel(StatePassBwdSettings, _state_bwd_inputs, _chunk_kernel(state_pass_bwd), input_sets=1,
                             per_mixer=True),
    "intra_chunk_bwd": Kernel(IntraChunkBwdSettings, _intra_chunk_bwd_inputs,
                              _chunk_kernel(intra_chunk_bwd, scaled=True), input_sets=1, per_mixer=True),
    "sparse_tokens_fwd": Kernel(Launch, _token_inputs, _tokens_fwd,
                                variants={"sparse_tokens_fwd": {}, "sparse_tokens_fwd save_rows": {"save_rows": True}}),
    "sparse_tokens_bwd": Kernel(Launch, _tokens_bwd_inputs, _tokens_bwd, input_sets=1),
    "product_key_address": Kernel(ProductKeySettings, _address_inputs, _address),
}


def grid_points(kernel, grid):
  """[{field: value}] of `kernel`'s part of grid ({"<kernel>.<field>": values}); [] when grid names none of it."""
  fields = {name.split(".", 1)[1]: values for name, values in grid.items() if name.split(".", 1)[0] == kernel}
  return [dict(zip(fields, values)) for values in itertools.product(*fields.values())] if fields else []


def launches(name, shape, grid, candidates):
  """[(launch label, settings)] of the kernel `name` at shape: the grid's points where it names the kernel, else
  with candidates its settings' candidates (labelled by the fields that differ from the defaults), else the
  defaults."""
  cls = KERNELS[name].settings
  points = grid_points(name, grid)
  if points:
    return [(" ".join(f"{field}={value}" for field, value in point.items()), settings_at(cls, shape, **point))
            for point in points]
  defaults = cls.defaults(shape)
  if not candidates:
    return [("default", defaults)]
  label = lambda s: " ".join(f"{field}={getattr(s, field)}" for field in field_names(cls)
                             if getattr(s, field) != getattr(defaults, field)) or "default"
  return [(label(s), s) for s in cls.candidates(shape)]


def _bytes(*trees):
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(trees))


def time_kernel(name, point, made, *, grid=None, candidates=False, reps=10, log=print):
  """The records of the kernel `name` of KERNELS at point: its reference, then each variant at each launch."""
  entry, s = KERNELS[name], point.shape
  interpret = _interpret()
  where = " ".join(str(x) for x in (point.mixer, f"{s.B}x{s.T}", s.chunk_size and f"C={s.chunk_size}",
                                    point.lower_bound and f"lower_bound={point.lower_bound:g}") if x)
  base = {"mixer": point.mixer, "B": s.B, "T": s.T, "H": s.H, "K": s.K, "chunk_size": s.chunk_size,
          "lower_bound": point.lower_bound}
  records = []

  def record(kernel, launch, settings=None, **fields):
    as_dict = settings and {field: getattr(settings, field) for field in field_names(type(settings))}
    records.append({**base, "kernel": kernel, "launch": launch, "settings": as_dict, "floor_ms": None,
                    "error": None, **fields})
    if records[-1]["error"]:
      log(f"  failed: {records[-1]['error']}")

  try:  # inputs named as the kernel's arguments, the same for every launch
    sets = [entry.inputs(point, 10 * i, made) for i in range(entry.input_sets)]
  except Exception as error:  # inputs that do not fit are a result
    record(name, "inputs", error=error_text(error))
    return records
  names, arg_sets = tuple(sets[0]), [tuple(inputs.values()) for inputs in sets]

  def timed(kernel, launch, fn, settings=None):
    log(f"{where} {kernel} {launch}: compiling and timing...")
    fields = {}
    try:
      if entry.memory_bound:
        fields["floor_ms"] = (_bytes(sets[0]) + _bytes(jax.eval_shape(fn, **sets[0]))) / BANDWIDTH * 1e3
      compiled, fields["compile_s"] = compile_timed(lambda *values: fn(**dict(zip(names, values))), *arg_sets[0])
      fields["ms"] = median_ms(compiled, arg_sets, reps)
    except Exception as error:  # a launch that does not compile or fit is a result
      fields["error"] = error_text(error)
    record(kernel, launch, settings, **fields)

  if entry.reference is not None:
    reference_name, reference = entry.reference
    timed(reference_name, "XLA", reference(point))
  for kernel, variant in (entry.variants or {name: {}}).items():
    for launch, settings in launches(name, s, grid or {}, candidates):
      timed(kernel, launch, entry.run(point, settings, interpret, **variant), settings)
  return records


COLUMNS = (Column("mixer", "mixer"), Column("B x T", lambda r: f"{r['B']}x{r['T']}"), Column("C", "chunk_size", "d"),
           Column("kernel", "kernel"), Column("launch", "launch"), Column("compile s", "compile_s", ".1f"),
           Column("ms", "ms", ".3f"), Column("floor ms", "floor_ms", ".3f"), Column("note", lambda r: r["error"] or ""))


def format_table(records):
  """A markdown table: one row per (mixer, shape, chunk size, kernel, launch), the lower bound beside the chunk size
  where a record has one."""
  bounded = any(r.get("lower_bound") is not None for r in records)
  columns = COLUMNS[:3] + (Column("lower bound", "lower_bound", "g"),) + COLUMNS[3:] if bounded else COLUMNS
  return table(columns, records)


def _parts(settings):
  """The kernels to time, in KERNELS' order: settings.parts, or every kernel when it names none."""
  return [name for name in KERNELS if not settings.parts or name in settings.parts]


def check_settings(settings):
  """ValueError naming the setting unless `settings` (registry.KernelsSettings) can run."""
  s = settings
  if not s.mixers or any(m not in ops.MIXERS for m in s.mixers):
    raise ValueError(f"mixers: expected some of {tuple(ops.MIXERS)}, got {list(s.mixers)}")
  if any(p not in KERNELS for p in s.parts):
    raise ValueError(f"parts: expected some of {tuple(KERNELS)} (none: all), got {list(s.parts)}")
  if s.head_dim < 16 or s.head_dim & (s.head_dim - 1):
    raise ValueError(f"head_dim: expected a power of two >= 16 (Triton blocks), got {s.head_dim}")
  if math.isqrt(s.num_slots) ** 2 != s.num_slots:
    raise ValueError(f"num_slots: expected a perfect square (product-key addressing), got {s.num_slots}")
  if s.topk < 16 or s.topk & (s.topk - 1) or s.topk > s.num_slots:
    raise ValueError(f"topk: expected a power of two >= 16 (Triton blocks) and at most num_slots, got {s.topk}")
  if s.lower_bound is not None:
    per_head = [m for m in s.mixers if ops.MIXERS[m].decay == "head"]
    if per_head:
      raise ValueError(f"lower_bound: bounds a per-channel decay, expected mixers without {per_head} (one decay "
                       f"per head)")
    for C in s.chunk_sizes:
      check_lower_bound(s.lower_bound, C)
  for B, T in parse_shapes(",".join(s.shapes)):
    bad = [C for C in s.chunk_sizes if T % C]
    if bad:
      raise ValueError(f"chunk_sizes: the kernels take whole chunks: {bad} do not divide T = {T}")
  for name, values in s.grid.items():
    kernel, _, field = name.partition(".")
    if kernel not in KERNELS:
      raise ValueError(f"grid.{name}: expected grid.<kernel>.<field> with a kernel of {tuple(KERNELS)}")
    fields = field_names(KERNELS[kernel].settings)
    if field not in fields or not values:
      raise ValueError(f"grid.{name}: expected a field of {kernel}'s settings {fields} and values")


def points(settings):
  """[(point, kernel names)] of the run: per shape, a point per mixer and chunk size for the dense kernels, then one
  for the others."""
  s = settings
  parts = _parts(s)
  dense = [name for name in parts if KERNELS[name].per_mixer]
  others = [name for name in parts if not KERNELS[name].per_mixer]
  out = []
  for B, T in parse_shapes(",".join(s.shapes)):
    shape = Shape(B=B, T=T, H=s.heads, K=s.head_dim, V=s.head_dim, dtype=s.dtype, N=s.num_slots, W=s.topk)
    if dense:
      out += [(Point(mixer, shape._replace(chunk_size=C), s.lower_bound), dense) for mixer in s.mixers
              for C in s.chunk_sizes]
    if others:
      out.append((Point(None, shape), others))
  return out


def bench(settings, out_dir, tag, log=print):
  """The `kernels` mode over `settings` (registry.KernelsSettings), the report rewritten after every point; returns
  (records, paths)."""
  s = settings
  meta = {**run_metadata(), "config": dataclasses.asdict(s)}
  notes = [f"- H={s.heads} K=V={s.head_dim} {s.dtype}, SDM N={s.num_slots} W=R={s.topk}; median of {s.reps} warm "
           f"runs; floor: the launch's bytes at {BANDWIDTH / 1e12:.1f} TB/s"]
  records = []
  for point, names in points(s):
    made = {}  # what the kernels of this point share, freed after it
    for name in names:
      records += time_kernel(name, point, made, grid=s.grid, candidates=s.candidates, reps=s.reps, log=log)
    paths = write_tables(records, meta, out_dir, tag, "Pallas kernels", notes, format_table(records))
  log(f"\nwrote {paths['json']}, {paths['md']}\n" + format_table(records))
  return records, {ext: paths[ext] for ext in ("json", "md")}
