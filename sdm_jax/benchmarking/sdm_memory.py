"""The training memory of Sparse Delta Memory's op per impl and option (the registry's `sdm_memory` mode): what
its backward keeps and what XLA's compiled forward+backward needs, and on the device its time, the peak and how
far each option's results are from the first entry's.

An entry is "impl[:rows_dtype:rows_segments[:table_dtype[:table_grad_dtype]]][@launch]": "scan" (plain autodiff
through the token scan), "chunk" (the chunked op's memory-lean backward), "pallas" with `sparse_delta_rule`'s options
of what its backward gets the rows from, what the table is stored in and what the backward stores the table's
cotangent in, and after "@" the token kernels' launch settings
"BVxWARPS/BVxWARPS" (block_v and num_warps of the forward, then of the backward; default 64x8/64x8): a launch sweep
is entries that differ only there. The loss is sum(o * r_o), the final table unused as in
training. Per entry: the bytes jax.vjp of the op keeps for its backward (m0 left out: it is the parameter, held
anyway), XLA's memory analysis of jit(value_and_grad(loss)) (temp, argument, output), and unless compile_only
(abstract inputs: nothing runs, so GPU shapes compile on a CPU) the median time of the compiled step
(`timing.median_ms`), the process's peak bytes in use after it, and the relative errors of o and of the worst
gradient against the first entry. The peak counter cannot be reset, so the entries run in ascending order of saved
bytes: an entry's peak is its own where it exceeds every earlier one (peak_is_own).
"""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.benchmarking.op_bench import parse_shapes
from sdm_jax.benchmarking.sdm_bench import sdm_calls, sdm_options, sdm_shapes
from sdm_jax.benchmarking.tables import Column, cell, table, write_tables
from sdm_jax.benchmarking.timing import error_text, median_ms, peak_device_bytes, run_metadata
from sdm_jax.ops.sparse_pallas import PallasConfig
from sdm_jax.testing.errors import relative_error
from sdm_jax.testing.inputs import sdm_inputs

IMPLS = ("scan", "chunk", "pallas")


def parse_launch(text):
  """'BVxWARPS/BVxWARPS' (the forward's, then the backward's block_v and num_warps) -> the op's launch option."""
  try:
    launch = tuple(tuple(int(n) for n in part.split("x")) for part in text.split("/"))
    PallasConfig(launch=launch)
  except ValueError as error:
    raise ValueError(f"entries: expected a launch 'BVxWARPS/BVxWARPS' (block_v and num_warps of the forward, then "
                     f"the backward), e.g. 64x8/32x4, got {text!r} ({error})") from None
  return launch


def parse_entry(entry):
  """'impl[:rows_dtype:rows_segments[:table_dtype[:table_grad_dtype]]][@launch]' -> (impl, the op's keyword
  options)."""
  entry, at, launch = entry.partition("@")
  impl, *rest = entry.split(":")
  expected = (f"impl[:rows_dtype:rows_segments[:table_dtype[:table_grad_dtype]]][@BVxWARPS/BVxWARPS] with impl one "
              f"of {IMPLS} (options and launch: pallas only)")
  if impl not in IMPLS or len(rest) not in (0, 2, 3, 4) or ((rest or at) and impl != "pallas"):
    raise ValueError(f"entries: expected {expected}, got {entry + at + launch!r}")
  options = sdm_options(":".join(rest), "entries") if rest else {}
  if at:
    options["launch"] = parse_launch(launch)
  return impl, options


def saved_bytes(forward, floats, ints):
  """Bytes of what jax.vjp of the op keeps for the backward, m0 (the parameter, held anyway) left out."""
  vjp = jax.eval_shape(lambda fl, it: jax.vjp(lambda f: forward(f, it), fl)[1], floats, ints)
  m0 = (floats["m0"].shape, floats["m0"].dtype)
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(vjp) if (x.shape, x.dtype) != m0)


def _memory(compiled):
  stats = compiled.memory_analysis()
  return {"temp_bytes": stats.temp_size_in_bytes, "argument_bytes": stats.argument_size_in_bytes,
          "output_bytes": stats.output_size_in_bytes,
          "total_bytes": stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes}


def compiled_memory(impl, *, B=1, T=4096, H=2, N=65536, V=256, W=64, R=64, chunk_size=16, **options):
  """XLA's memory analysis (bytes) of jit(value_and_grad(loss)) for one impl and its options, compiled for
  abstract inputs (nothing runs)."""
  floats, ints = sdm_shapes(B, T, H, N, V, W, R)
  r_o = jax.ShapeDtypeStruct((B, T, H, V), jnp.float32)
  step = jax.jit(jax.value_and_grad(sdm_calls(impl, chunk_size, **options)[1], has_aux=True))
  return _memory(step.lower(floats, ints, r_o).compile())


def measure(entries, *, B, T, H, N, V, W, chunk_size=16, reps=5, compile_only=False, log=print, on_progress=None):
  """One record per entry, in the given order (the module docstring); on_progress(records) after each entry."""
  parsed = {entry: parse_entry(entry) for entry in entries}
  if compile_only:
    floats, ints = sdm_shapes(B, T, H, N, V, W, W)
    r_o = jax.ShapeDtypeStruct((B, T, H, V), jnp.float32)
  else:
    floats, ints = sdm_inputs(B, T, H, N, V, W, W, 0)
    r_o = jnp.asarray(np.random.default_rng(1).standard_normal((B, T, H, V), np.float32))
  calls = {entry: sdm_calls(impl, chunk_size, **options) for entry, (impl, options) in parsed.items()}
  records = {entry: {"entry": entry, "impl": impl, **options, "error": None}
             for entry, (impl, options) in parsed.items()}
  for entry in entries:
    try:
      records[entry]["saved_bytes"] = saved_bytes(calls[entry][0], floats, ints)
    except Exception as error:
      records[entry]["error"] = error_text(error)
  results, peak_so_far = {}, 0
  for entry in sorted(entries, key=lambda e: records[e].get("saved_bytes") or 0):
    record = records[entry]
    if record["error"]:
      continue
    log(f"{entry}: compiling{'' if compile_only else ' and timing'}...")
    try:
      start = time.perf_counter()
      compiled = jax.jit(jax.value_and_grad(calls[entry][1], has_aux=True)).lower(floats, ints, r_o).compile()
      record.update(compile_s=time.perf_counter() - start, **_memory(compiled))
      if not compile_only:
        (_, o), grads = compiled(floats, ints, r_o)
        results[entry] = jax.device_get((o, grads))
        del o, grads
        record["fwd_bwd_ms"] = median_ms(compiled, [(floats, ints, r_o)], reps)
        peak = peak_device_bytes()
        record["peak_bytes"], record["peak_is_own"] = peak, None if peak is None else peak > peak_so_far
        peak_so_far = max(peak_so_far, peak or 0)
    except Exception as error:  # an entry that does not fit is a result
      record["error"] = error_text(error)
      log(f"  failed: {record['error']}")
    if on_progress is not None:
      on_progress([records[e] for e in entries])
  reference = results.get(entries[0])
  for entry in entries[1:]:
    if reference is None or entry not in results:
      continue
    o, grads = results[entry]
    records[entry]["o_rel_err"] = relative_error(o, reference[0])
    errors = {name: relative_error(g, reference[1][name]) for name, g in grads.items()}
    worst = max(errors, key=errors.get)
    records[entry].update(worst_grad=worst, worst_grad_rel_err=errors[worst])
  return [records[e] for e in entries]


def format_table(records):
  """A markdown table, bytes in GB where any is above 1 GB, else MB."""
  largest = max([r.get(k) or 0 for r in records for k in ("saved_bytes", "temp_bytes", "peak_bytes")] + [0])
  unit, scale = ("GB", 1e9) if largest > 1e9 else ("MB", 1e6)
  peak = lambda r: f"<={cell(r['peak_bytes'], '.2f', scale)}" if r.get("peak_is_own") is False else r.get("peak_bytes")
  worst = lambda r: None if r.get("worst_grad") is None else f"{r['worst_grad_rel_err']:.1e} ({r['worst_grad']})"
  return table([Column("entry", "entry"), *[Column(f"{name} {unit}", f"{name}_bytes", ".2f", scale)
                                             for name in ("saved", "temp", "argument", "output")],
                Column(f"peak {unit}", peak, ".2f", scale), Column("fwd+bwd ms", "fwd_bwd_ms", ".1f"),
                Column("o error", "o_rel_err", ".1e"), Column("worst gradient error", worst),
                Column("note", lambda r: r["error"] or "")], records)


def check_settings(settings):
  """ValueError naming the setting unless `settings` (registry.SdmMemorySettings) can run."""
  if not settings.entries:
    raise ValueError("entries: expected at least one entry")
  for entry in settings.entries:
    parse_entry(entry)
  if len(parse_shapes(settings.shape)) != 1:
    raise ValueError(f"shape: expected one B x T, got {settings.shape!r}")


def bench(settings, out_dir, tag, log=print):
  """The `sdm_memory` mode over `settings` (registry.SdmMemorySettings), the report written after every entry;
  returns (records, paths)."""
  s = settings
  (B, T), = parse_shapes(s.shape)
  meta = {**run_metadata(), "config": dataclasses.asdict(s)}
  notes = [f"- sparse_delta_rule, B={B} T={T} H={s.heads} N={s.num_slots} V={s.value_dim} W=R={s.topk}; "
           "loss sum(o * r_o), the final table unused; saved: what jax.vjp keeps (m0 left out); temp, argument, "
           "output: XLA's memory analysis of jit(value_and_grad(loss))",
           "- " + ("compile only (abstract inputs, nothing ran)" if s.compile_only else
                   "peak: the process's peak_bytes_in_use after the entry ('<=': not above an earlier entry's, so "
                   "not its own); errors: relative Frobenius norms against the first entry")]
  report = lambda records: write_tables(records, meta, out_dir, tag, "SDM training memory", notes,
                                        format_table(records))
  records = measure(s.entries, B=B, T=T, H=s.heads, N=s.num_slots, V=s.value_dim, W=s.topk, chunk_size=s.chunk_size,
                    reps=s.reps, compile_only=s.compile_only, log=log, on_progress=report)
  paths = report(records)
  log(f"\nwrote {paths['json']}, {paths['md']}\n" + format_table(records))
  return records, {ext: paths[ext] for ext in ("json", "md")}
