"""What packing documents into rows (segment_ids, DESIGN.md section 9) costs each op: the registry's `packed` mode.

Each op, forward and forward+backward (the gradient of sum(o * r) with respect to every float input, the final
state unused as in training), on the same inputs unpacked and as rows of `docs` documents each (boundaries drawn at
random, so most start inside a chunk), with the ratio packed / unpacked; the bar of issue 23 is TARGET. The dense
ops take `testing.inputs.make_op_inputs` (K = V, no initial state) at each chunk size; the SDM op (`sdm`)
`testing.inputs.sdm_inputs` at each of its options (rows_dtype:rows_segments[:table_dtype[:table_grad_dtype]]), its
packed gradients checked finite (their accuracy against the documents run alone is
tests/ops/test_sparse_packed.py's). Two clocks (DESIGN.md section 7), both rotating 3 input sets:
`timing.median_ms` (on the GPU the kernels' summed durations from CUPTI) and the host clock around back-to-back calls
with one synchronisation at the end (`timing.back_to_back_ms`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax import ops
from sdm_jax.benchmarking import sdm_bench
from sdm_jax.benchmarking.op_bench import parse_shapes
from sdm_jax.benchmarking.sdm_bench import sdm_options
from sdm_jax.benchmarking.tables import NO_KERNELS, Column, kernel_section, table, write_tables
from sdm_jax.benchmarking.timing import (back_to_back_ms, error_text, kernel_summary, kernel_timer_available,
                                         median_ms, run_metadata)
from sdm_jax.testing.inputs import document_ids, make_op_inputs, make_readouts, sdm_inputs

INPUT_SETS = 3
TARGET = 1.1  # issue 23: a packed row of 8 documents at most 1.1x an unpacked row
SDM = "sdm"


def dense_calls(mixer, impl, chunk_size):
  """(forward, forward+backward) of a dense op, each jitted, each (args, r_o, segment_ids or None) -> arrays."""
  def o(args, segment_ids):
    return ops.MIXERS[mixer].op(**args, impl=impl, chunk_size=chunk_size, use_qk_l2norm=True,
                                output_final_state=True, segment_ids=segment_ids)[0]

  def loss(args, r_o, segment_ids):
    return jnp.sum(o(args, segment_ids).astype(jnp.float32) * r_o)

  return jax.jit(lambda args, r_o, segment_ids: o(args, segment_ids)), jax.jit(jax.value_and_grad(loss))


def sdm_calls(impl, **options):
  """(forward, forward+backward) of the SDM op with its keyword `options` (`sdm_bench.sdm_options`), each jitted,
  each (floats, ints, r_o, segment_ids or None) -> arrays (`sdm_bench.sdm_calls`)."""
  forward, loss = sdm_bench.sdm_calls(impl, **options)
  return (jax.jit(lambda floats, ints, r_o, segment_ids: forward(floats, ints, segment_ids)),
          jax.jit(jax.value_and_grad(loss, has_aux=True)))


def time_pair(forward, step, arg_sets, ids, reps, breakdown=False):
  """{part: {unpacked_ms, packed_ms, unpacked_host_ms, packed_host_ms, ratio, ratio_host, and with breakdown
  unpacked_kernels, packed_kernels: `timing.kernel_summary` of one more run}} for part fwd, fwd_bwd; arg_sets:
  tuples of the call's arguments before segment_ids."""
  timed = {}
  for part, fn in (("fwd", forward), ("fwd_bwd", step)):
    row = {}
    for layout, segment_ids in (("unpacked", None), ("packed", ids)):
      calls = [(*args, segment_ids) for args in arg_sets]
      row[f"{layout}_ms"] = median_ms(fn, calls, reps)
      row[f"{layout}_host_ms"] = back_to_back_ms(fn, calls, reps)
      if breakdown:
        row[f"{layout}_kernels"] = kernel_summary(
            lambda fn=fn, call=calls[0]: jax.block_until_ready(fn(*call)), top=30)
    row["ratio"] = row["packed_ms"] / row["unpacked_ms"]
    row["ratio_host"] = row["packed_host_ms"] / row["unpacked_host_ms"]
    timed[part] = row
  return timed


def _records(mixer, B, T, variant, compute, log):
  """The fwd and fwd_bwd records of one (mixer, shape, variant); compute() -> (time_pair's dict, note)."""
  base = {"mixer": mixer, "B": B, "T": T, "variant": variant}
  log(f"{mixer} {B}x{T} {variant}: compiling and timing...")
  try:
    timed, note = compute()
  except Exception as error:  # recorded; the sweep goes on
    log(f"  failed: {error_text(error)}")
    return [{**base, "part": part, "error": error_text(error)} for part in ("fwd", "fwd_bwd")]
  records = []
  for part, row in timed.items():
    above = max(row["ratio"], row["ratio_host"]) > TARGET
    records.append({**base, "part": part, **row, "error": None,
                    "note": "; ".join(filter(None, [f"above {TARGET}" if above else "", note]))})
    log(f"  {part}: packed / unpacked {row['ratio']:.3f} / {row['ratio_host']:.3f}")
  return records


def run_sweep(settings, log=print, on_progress=None):
  """Every (mixer, shape, chunk size or SDM option) of `settings` (registry.PackedSettings); returns the records."""
  s = settings
  records = []
  for B, T in parse_shapes(",".join(s.shapes)):
    ids = jnp.asarray(document_ids(B, T, s.docs))
    for mixer in s.mixers:
      if mixer == SDM:
        H, N, V, W = s.sdm_heads, s.num_slots, s.sdm_value_dim, s.topk
        sets = [sdm_inputs(B, T, H, N, V, W, W, 10 * i) for i in range(INPUT_SETS)]
        r_o = jnp.asarray(np.random.default_rng(1).standard_normal((B, T, H, V), np.float32))
        for option in s.sdm_options:
          def compute(option=option):
            forward, step = sdm_calls(s.impl, **sdm_options(option, "sdm_options"))
            _, grads = step(*sets[0], r_o, ids)
            finite = all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
            timed = time_pair(forward, step, [(*x, r_o) for x in sets], ids, s.reps, s.breakdown)
            return timed, "" if finite else "packed gradients not finite"
          records += _records(mixer, B, T, f"{option} H={H} N={N} V={V} W=R={W}", compute, log)
          if on_progress is not None:
            on_progress(records)
        continue
      H, K = s.heads, s.head_dim
      for chunk_size in s.chunk_sizes:
        def compute(mixer=mixer, chunk_size=chunk_size):
          arg_sets = [make_op_inputs(mixer, B, T, H, K, K, s.dtype, 10 * i, initial_state=False)[1]
                      for i in range(INPUT_SETS)]
          r_o, _ = make_readouts(B, T, H, K, K, s.dtype, 0, state=False)
          forward, step = dense_calls(mixer, s.impl, chunk_size)
          return time_pair(forward, step, [(args, r_o) for args in arg_sets], ids, s.reps, s.breakdown), ""
        records += _records(mixer, B, T, f"chunk {chunk_size} H={H} K=V={K}", compute, log)
        if on_progress is not None:
          on_progress(records)
  return records


def format_table(records):
  """A markdown table: one row per (mixer, shape, variant, part); with breakdown, each run's kernels after it,
  unpacked then packed."""
  part = lambda r: r["part"].replace("_", "+")
  pair = lambda a, b: lambda r: None if r.get(a) is None else (r[a], r.get(b))
  columns = [Column("mixer", "mixer"), Column("B x T", lambda r: f"{r['B']}x{r['T']}"), Column("variant", "variant"),
             Column("part", part),
             Column("unpacked ms (device / host)", pair("unpacked_ms", "unpacked_host_ms"), ".3f"),
             Column("packed ms (device / host)", pair("packed_ms", "packed_host_ms"), ".3f"),
             Column("packed / unpacked", pair("ratio", "ratio_host"), ".3f"),
             Column("note", lambda r: r.get("error") or r.get("note") or "")]
  return table(columns, records) + kernel_section(
      records, lambda r: f"{r['mixer']} {r['B']}x{r['T']} {r['variant']} {part(r)}",
      {"unpacked_kernels": "unpacked", "packed_kernels": "packed"})


def check_settings(settings):
  """ValueError naming the setting unless `settings` (registry.PackedSettings) can run."""
  choices = (*ops.MIXERS, SDM)
  if not settings.mixers or any(m not in choices for m in settings.mixers):
    raise ValueError(f"mixers: expected some of {choices}, got {list(settings.mixers)}")
  shapes = parse_shapes(",".join(settings.shapes))
  if not shapes or any(T <= settings.docs for _, T in shapes) or settings.docs < 1:
    raise ValueError(f"docs: expected 1 <= docs < T for every shape, got {settings.docs} for {settings.shapes}")
  for option in settings.sdm_options:
    sdm_options(option, "sdm_options")


def bench(settings, out_dir, tag, log=print):
  """The `packed` mode over `settings` (registry.PackedSettings), the report rewritten after every point; returns
  (records, paths)."""
  s = settings
  meta = {**run_metadata(), "config": dataclasses.asdict(s)}
  notes = [f"- {s.docs} documents per packed row at random boundaries, impl={s.impl}; ms: device clock "
           f"(`timing.median_ms`, {s.reps} runs) / host clock ({s.reps} back to back, one synchronisation); "
           f"'above {TARGET}': issue 23's bar missed on either clock"]
  if s.breakdown and not kernel_timer_available():
    notes += [NO_KERNELS]
  report = lambda records: write_tables(records, meta, out_dir, tag, "Packed documents", notes,
                                        format_table(records))
  records = run_sweep(s, log=log, on_progress=report)
  paths = report(records)
  log(f"\nwrote {paths['json']}, {paths['md']}\n" + format_table(records))
  return records, {ext: paths[ext] for ext in ("json", "md")}
