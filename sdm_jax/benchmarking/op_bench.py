"""Throughput of the mixer ops over shapes (DESIGN.md section 7), with flash-linear-attention as the peer: the
registry's `ops` mode.

Each (mixer, impl, B x T) is timed for the forward and for forward+backward (jax.value_and_grad of
sum(o * r) w.r.t. every input) with SPEC.md section 7's two timers, over calls that rotate between 3 input sets:
the median of `reps` warm runs (on the GPU, device kernel time: `timing.median_ms`), and the host clock around
`reps` back-to-back calls (`timing.back_to_back_ms`: dispatch and launch gaps included). A config that fails (OOM,
an impl not built) is recorded with its error and the sweep goes on. With breakdown, one more warm run of each is
listed kernel by kernel (CUPTI), ours and the peer's, so that each of our kernels can be set against the fla stage
it competes with.
"""


import dataclasses
import json

import jax
import numpy as np

from sdm_jax import ops
from sdm_jax.benchmarking import fla_peer
from sdm_jax.benchmarking.op_inputs import make_loss, make_op_inputs, make_readouts
from sdm_jax.benchmarking.timing import (back_to_back_ms, compile_timed, error_text, format_kernels, kernel_summary,
                                         median_ms, run_metadata, write_tables)
from sdm_jax.training.config import close_names

INPUT_SETS = 3
PEER = "fla"


def parse_shapes(text):
  """'8x2048,1x16384' -> [(8, 2048), (1, 16384)]."""
  try:
    return [tuple(int(n) for n in item.lower().split("x")) for item in text.split(",") if item]
  except ValueError:
    raise ValueError(f"shapes: expected a list like 8x2048,1x16384, got {text!r}") from None


def check_settings(settings):
  """ValueError naming the setting unless `settings` (registry.OpsSettings) can run."""
  unknown = [m for m in settings.mixers if m not in ops.MIXERS]
  if unknown or not settings.mixers:
    raise ValueError(f"mixers: expected some of {tuple(ops.MIXERS)}, got {list(settings.mixers)}"
                     f"{close_names(unknown[0], ops.MIXERS) if unknown else ''}")
  if not settings.impls:
    raise ValueError("impls: expected at least one impl")
  if not parse_shapes(",".join(settings.shapes)):
    raise ValueError("shapes: expected at least one B x T")


def _record(mixer, impl, B, T, timings=None, error=None, **extra):
  record = {"mixer": mixer, "impl": impl, "B": B, "T": T, "tokens": B * T, "error": error, **extra}
  for part in ("fwd", "fwd_bwd"):
    ms = timings[f"{part}_ms"] if timings else None
    record[f"{part}_ms"] = ms
    record[f"{part}_tokens_per_s"] = B * T / (ms * 1e-3) if ms else None
    record[f"{part}_host_ms"] = timings.get(f"{part}_host_ms") if timings else None
  return {**record, **{k: v for k, v in (timings or {}).items() if k.startswith(("compile", "kernels"))}}


def time_impl(fn, arg_sets, readout, impl, chunk_size, reps, breakdown=False):
  """Returns (timings {compile_fwd_s, compile_fwd_bwd_s, fwd_ms, fwd_bwd_ms, fwd_host_ms, fwd_bwd_host_ms (back to
  back), and with breakdown kernels_fwd and kernels_fwd_bwd: `timing.kernel_summary` of one more run of each}, o of
  the first set)."""
  def forward(args):
    return fn(args, impl=impl, chunk_size=chunk_size)[0]

  fwd, compile_fwd_s = compile_timed(forward, arg_sets[0])
  step, compile_step_s = compile_timed(jax.value_and_grad(make_loss(fn, impl, chunk_size), has_aux=True),
                                       arg_sets[0], readout, None)
  timings = {"compile_fwd_s": compile_fwd_s, "compile_fwd_bwd_s": compile_step_s,
             "fwd_ms": median_ms(fwd, [(args,) for args in arg_sets], reps),
             "fwd_bwd_ms": median_ms(step, [(args, readout, None) for args in arg_sets], reps),
             "fwd_host_ms": back_to_back_ms(fwd, [(args,) for args in arg_sets], reps),
             "fwd_bwd_host_ms": back_to_back_ms(step, [(args, readout, None) for args in arg_sets], reps)}
  if breakdown:
    timings["kernels_fwd"] = kernel_summary(lambda: jax.block_until_ready(fwd(arg_sets[0])))
    timings["kernels_fwd_bwd"] = kernel_summary(lambda: jax.block_until_ready(step(arg_sets[0], readout, None)))
  return timings, np.asarray(fwd(arg_sets[0]), np.float32)


def run_sweep(mixers, impls, shapes, *, H, K, V, dtype, chunk_size=64, reps=20, seed=0, peer=True, breakdown=False,
              log=print, on_progress=None):
  """Times every (mixer, impl, shape), and the fla peer where `peer` and it loads; with breakdown, also each
  run's kernels (`time_impl`).

  Returns (records, peer_notes {mixer: description or why skipped}). Our records carry
  `vs_peer_fwd` / `vs_peer_fwd_bwd` = peer ms / our ms (above 1: faster than the peer).
  on_progress(records, peer_notes), if given, is called after every shape, so that a sweep cut off
  by a time limit still leaves what it measured.
  """
  records, peer_notes = [], {}
  for mixer in mixers:
    peer_op = None
    if peer:
      peer_op, peer_notes[mixer] = fla_peer.load_peer(mixer)
      log(f"peer for {mixer}: {peer_notes[mixer]}")
    for B, T in shapes:
      ours, o_ref = [], None
      try:
        built = [make_op_inputs(mixer, B, T, H, K, V, dtype, seed + 10 * i, initial_state=False)
                 for i in range(INPUT_SETS)]
        fn, arg_sets = built[0][0], [args for _, args in built]
        readout, _ = make_readouts(B, T, H, K, V, dtype, seed, state=False)
      except Exception as error:
        records += [_record(mixer, impl, B, T, error=error_text(error)) for impl in impls]
        continue
      for impl in impls:
        log(f"{mixer} {impl} {B}x{T}: compiling and timing...")
        try:
          timings, o = time_impl(fn, arg_sets, readout, impl, chunk_size, reps, breakdown)
          ours.append(_record(mixer, impl, B, T, timings))
          o_ref = o if o_ref is None else o_ref
        except Exception as error:
          ours.append(_record(mixer, impl, B, T, error=error_text(error)))
          log(f"  failed: {ours[-1]['error']}")
      records += ours
      if on_progress is not None:  # before the peer, whose autotuning can outlast a time limit
        on_progress(records, peer_notes)
      if peer_op is not None:
        log(f"{mixer} {PEER} {B}x{T}: timing...")
        records.append(_time_peer_config(peer_op, mixer, B, T, arg_sets, readout, reps, o_ref, ours, breakdown))
      if on_progress is not None:
        on_progress(records, peer_notes)
  return records, peer_notes


def _time_peer_config(peer_op, mixer, B, T, arg_sets, readout, reps, o_ref, ours, breakdown=False):
  try:
    host_sets = [{name: np.asarray(x) for name, x in args.items()} for args in arg_sets]
    timings, o = fla_peer.time_peer(peer_op, host_sets, np.asarray(readout), reps, breakdown)
  except Exception as error:
    return _record(mixer, PEER, B, T, error=error_text(error))
  # The peer must compute what we compute, or the ratio means nothing.
  rel = None if o_ref is None else float(np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref))
  for record in ours:
    for part in ("fwd", "fwd_bwd", "fwd_host", "fwd_bwd_host"):
      if record[f"{part}_ms"] and timings.get(f"{part}_ms"):
        record[f"vs_peer_{part}"] = timings[f"{part}_ms"] / record[f"{part}_ms"]
  return _record(mixer, PEER, B, T, timings, out_rel_err_vs_ours=rel)


def _fmt(x, spec):
  return "-" if x is None else format(x, spec)


def format_table(records):
  """A markdown table: one row per (mixer, impl, shape)."""
  lines = ["| mixer | impl | B x T | fwd ms | fwd Mtok/s | fwd+bwd ms | fwd+bwd Mtok/s | vs fla fwd | "
           "vs fla fwd+bwd | back to back fwd / fwd+bwd ms | vs fla back to back | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in records:
    note = r["error"] or ""
    if r.get("out_rel_err_vs_ours") is not None:
      note = f"o rel err vs ours {r['out_rel_err_vs_ours']:.1e}"
    mtoks = [None if r[f"{p}_tokens_per_s"] is None else r[f"{p}_tokens_per_s"] / 1e6 for p in ("fwd", "fwd_bwd")]
    ratios = [None if r.get(f"vs_peer_{p}") is None else f"{r[f'vs_peer_{p}']:.2f}x"
              for p in ("fwd", "fwd_bwd", "fwd_host", "fwd_bwd_host")]
    host = f"{_fmt(r.get('fwd_host_ms'), '.3f')} / {_fmt(r.get('fwd_bwd_host_ms'), '.3f')}"
    cells = [r["mixer"], r["impl"], f"{r['B']}x{r['T']}", _fmt(r["fwd_ms"], ".3f"), _fmt(mtoks[0], ".2f"),
             _fmt(r["fwd_bwd_ms"], ".3f"), _fmt(mtoks[1], ".2f"), ratios[0] or "-", ratios[1] or "-", host,
             f"{ratios[2] or '-'} / {ratios[3] or '-'}", note]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot_throughput(records, path):
  """tokens/s against sequence length, forward and forward+backward, a line per (mixer, impl)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
  series = sorted({(r["mixer"], r["impl"]) for r in records})
  seq_lens = sorted({r["T"] for r in records})
  for ax, part, title in zip(axes, ("fwd", "fwd_bwd"), ("forward", "forward + backward")):
    for mixer, impl in series:
      points = sorted((r["T"], r[f"{part}_tokens_per_s"]) for r in records
                      if (r["mixer"], r["impl"]) == (mixer, impl) and r[f"{part}_tokens_per_s"])
      if points:
        ax.plot(*zip(*points), marker="o", linestyle="--" if impl == PEER else "-", label=f"{mixer} {impl}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(seq_lens, [str(T) for T in seq_lens])
    ax.minorticks_off()
    ax.set(yscale="log", xlabel="sequence length T", ylabel="tokens / s", title=title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def merge_reports(json_paths):
  """(records, meta) of one report made of bench reports written by separate runs (a sweep split over device
  calls): every run's records in the given order, meta the first run's with every run's command and the latest
  date. Each record keeps its own run's numbers (ours and the peer's of one shape always come from one run).
  Runs on different devices, jax versions or timers raise ValueError: their times are not comparable."""
  runs = []
  for path in json_paths:
    with open(path) as f:
      runs.append(json.load(f))
  if not runs:
    raise ValueError("merge: expected at least one report")
  for key in ("device", "jax_version", "timer"):
    seen = sorted({str(run.get(key)) for run in runs})
    if len(seen) > 1:
      raise ValueError(f"merge: the reports differ in {key}: {seen}")
  meta = {key: value for key, value in runs[0].items() if key != "results"}
  meta["date"] = max(run["date"] for run in runs)
  meta["command"] = " ; ".join(run["command"] for run in runs)
  meta["peer"] = {mixer: note for run in runs for mixer, note in run.get("peer", {}).items()}
  return [record for run in runs for record in run["results"]], meta


def kernel_lines(records):
  """Markdown lines: each record's kernels (`time_impl` with breakdown), forward and forward+backward."""
  lines = []
  for r in records:
    for part, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
      if r.get(f"kernels_{part}"):
        lines += format_kernels(f"{r['mixer']} {r['impl']} {r['B']}x{r['T']} {label}", r[f"kernels_{part}"])
  return lines


def write_report(records, meta, out_dir, tag):
  """Writes <out_dir>/<date>_<tag>.{json,md,png}; returns their paths."""
  notes = [f"- peer for {mixer}: {note}" for mixer, note in meta.get("peer", {}).items()]
  notes += ["- vs fla = fla ms / our ms (above 1: faster than fla); Mtok/s = B*T / time"]
  if meta.get("config", {}).get("breakdown") and not any(r.get("kernels_fwd") for r in records):
    notes += ["- breakdown: no kernel list, CUPTI is not available on this backend"]
  table = format_table(records)
  kernels = kernel_lines(records)
  if kernels:
    table += "\n\n## Kernels (CUPTI, one warm run, same-named kernels summed)\n\n" + "\n".join(kernels)
  paths = write_tables(records, meta, out_dir, tag, "Op throughput", notes, table)
  plot_throughput(records, paths["png"])
  return paths


def bench(settings, out_dir, tag, log=print):
  """The `ops` mode: run_sweep over `settings` (registry.OpsSettings), the report rewritten after every shape;
  returns (records, paths)."""
  s = settings
  meta = {**run_metadata(), "config": dataclasses.asdict(s)}
  report = lambda records, notes: write_report(records, {**meta, "peer": notes}, out_dir, tag)
  records, peer_notes = run_sweep(
      s.mixers, s.impls, parse_shapes(",".join(s.shapes)), H=s.heads, K=s.head_dim, V=s.value_dim or s.head_dim,
      dtype=s.dtype, chunk_size=s.chunk_size, reps=s.reps, seed=s.seed, peer=s.peer, breakdown=s.breakdown, log=log,
      on_progress=report)
  paths = report(records, peer_notes)
  log("\nwrote " + ", ".join(paths.values()))
  log(f"\n{meta['device']}, {s.dtype}, H={s.heads} K={s.head_dim}; vs fla = fla ms / our ms\n" + format_table(records))
  return records, paths


def merge(json_paths, out_dir, tag, log=print):
  """One report (table, plot) of the `ops` reports of several runs (`merge_reports`); returns its paths."""
  records, meta = merge_reports(json_paths)
  paths = write_report(records, meta, out_dir, tag)
  log("wrote " + ", ".join(paths.values()) + "\n" + format_table(records))
  return paths
