"""Throughput of the mixer ops over shapes (DESIGN.md section 7), with flash-linear-attention as the peer: the
registry's `ops` mode.

Each (mixer, impl, chunk size, B x T) is timed for the forward and for forward+backward (jax.value_and_grad of
sum(o * r) w.r.t. every input) with DESIGN.md section 7's two timers, over calls that rotate between 3 input sets:
the median of `reps` warm runs (on the GPU, device kernel time: `timing.median_ms`), and the host clock around
`reps` back-to-back calls (`timing.back_to_back_ms`: dispatch and launch gaps included). A config that fails (OOM,
an impl not built) is recorded with its error and the sweep goes on. With breakdown, one more warm run of each is
listed kernel by kernel (CUPTI), ours and the peer's, so that each of our kernels can be set against the fla stage
it competes with. The peer runs in each of its modes asked for (`fla_peer.PEER_MODES`), and the ratios of ours are
taken against its fastest. With bounded, each program of an impl that uses the op's lower_bound
(`ops.delta_rule.IMPLEMENTATIONS`, `uses_lower_bound`) is timed again with the peer's bound, so that both modes of ours
stand beside both of fla's. The sweep goes shape by shape, every mixer at each, so that a run cut off by a time
limit has every mixer at the shapes it reached; with compile_threads > 1 the programs of one mixer and shape (each
impl and chunk size, forward and forward+backward) are compiled at once before any is timed.
"""


import concurrent.futures
import dataclasses
import json

import jax
import numpy as np

from sdm_jax import ops
from sdm_jax.benchmarking import fla_peer
from sdm_jax.benchmarking.tables import NO_KERNELS, Column, kernel_section, table, write_tables
from sdm_jax.benchmarking.timing import (back_to_back_ms, compile_timed, error_text, kernel_summary, median_ms,
                                         run_metadata)
from sdm_jax.ops.validation import check_chunk_size
from sdm_jax.testing.errors import relative_error
from sdm_jax.testing.inputs import make_op_inputs, make_readouts
from sdm_jax.testing.runs import make_loss
from sdm_jax.training.config import close_names

INPUT_SETS = 3
PEER = "fla"
# The record fields `time_impl` lists kernels in with breakdown, and what each timed.
KERNEL_PARTS = {"kernels_fwd": "fwd", "kernels_fwd_bwd": "fwd+bwd"}


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
  for chunk_size in settings.chunk_size:
    check_chunk_size(chunk_size)
  fla_peer.check_modes(settings.peer_modes)
  if settings.bounded and not any(_uses_lower_bound(impl) for impl in settings.impls):
    raise ValueError(f"bounded: times again the impls that use lower_bound, expected one in impls, got "
                     f"{list(settings.impls)}")
  if settings.compile_threads < 1:
    raise ValueError(f"compile_threads: expected an integer >= 1, got {settings.compile_threads}")


def chunk_sizes(setting):
  """The chunk sizes of a run: the setting's, or (None,) for none, each impl's rule (`ops.delta_rule.chunk_size_of`)."""
  return tuple(setting) or (None,)


def _chunk_of(impl, chunk_size, T):
  """The chunk size impl runs T tokens at (None for the scan, which has none). For an impl the op refuses (its
  record holds the error), or in a --base tree older than the ops' chunk-size rule (which needs sizes given), the
  size asked for."""
  if impl == "scan":
    return None
  try:
    from sdm_jax.ops.delta_rule import chunk_size_of
    return chunk_size_of(impl, chunk_size, T)
  except (ImportError, ValueError):
    return chunk_size


def _uses_lower_bound(impl):
  """Whether the dense ops' impl `impl` computes differently with a lower_bound (False for a name the registry lacks,
  whose record holds the op's error, and in a --base tree older than the option)."""
  from sdm_jax.ops.delta_rule import IMPLEMENTATIONS
  return getattr(IMPLEMENTATIONS.get(impl), "uses_lower_bound", False)


def _bounded_suffix(lower_bound):
  return "" if lower_bound is None else f" lower_bound={lower_bound:g}"


def name_of(record):
  """A record's impl as the tables name it: "pallas", "pallas lower_bound=-5", "fla safe_gate"."""
  return record["impl"] + _bounded_suffix(record.get("lower_bound"))


def _record(mixer, impl, B, T, timings=None, error=None, **extra):
  record = {"mixer": mixer, "impl": impl, "B": B, "T": T, "tokens": B * T, "error": error, **extra}
  for part in ("fwd", "fwd_bwd"):
    ms = timings[f"{part}_ms"] if timings else None
    record[f"{part}_ms"] = ms
    record[f"{part}_tokens_per_s"] = B * T / (ms * 1e-3) if ms else None
    record[f"{part}_host_ms"] = timings.get(f"{part}_host_ms") if timings else None
  return {**record, **{k: v for k, v in (timings or {}).items() if k.startswith(("compile", "kernels"))}}


def compile_impl(fn, args, readout, impl, chunk_size, lower_bound=None):
  """(forward, forward+backward, {compile_fwd_s, compile_fwd_bwd_s}): the op's programs compiled for args, with
  lower_bound where it is not None (a --base tree older than the option runs the others)."""
  options = {} if lower_bound is None else {"lower_bound": lower_bound}

  def forward(args):
    return fn(args, impl=impl, chunk_size=chunk_size, **options)[0]

  fwd, compile_fwd_s = compile_timed(forward, args)
  step, compile_step_s = compile_timed(jax.value_and_grad(make_loss(fn, impl, chunk_size, **options), has_aux=True),
                                       args, readout, None)
  return fwd, step, {"compile_fwd_s": compile_fwd_s, "compile_fwd_bwd_s": compile_step_s}


def compile_all(fn, args, readout, programs, threads):
  """{(impl, chunk_size, lower_bound): `compile_impl`'s result, or the exception it raised} for every program,
  `threads` of them compiling at once (XLA compiles outside Python's lock)."""
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    futures = {program: pool.submit(compile_impl, fn, args, readout, *program) for program in programs}
  compiled = {}
  for program, future in futures.items():
    try:
      compiled[program] = future.result()
    except Exception as error:
      compiled[program] = error
  return compiled


def time_impl(fn, arg_sets, readout, impl, chunk_size, reps, breakdown=False, compiled=None, lower_bound=None):
  """Returns (timings {compile_fwd_s, compile_fwd_bwd_s, fwd_ms, fwd_bwd_ms, fwd_host_ms, fwd_bwd_host_ms (back to
  back), and with breakdown kernels_fwd and kernels_fwd_bwd: `timing.kernel_summary` of one more run of each}, o of
  the first set). compiled: `compile_impl`'s result for these shapes (None: compiled here, with lower_bound)."""
  if compiled is None:
    compiled = compile_impl(fn, arg_sets[0], readout, impl, chunk_size, lower_bound)
  fwd, step, compile_s = compiled
  timings = {**compile_s,
             "fwd_ms": median_ms(fwd, [(args,) for args in arg_sets], reps),
             "fwd_bwd_ms": median_ms(step, [(args, readout, None) for args in arg_sets], reps),
             "fwd_host_ms": back_to_back_ms(fwd, [(args,) for args in arg_sets], reps),
             "fwd_bwd_host_ms": back_to_back_ms(step, [(args, readout, None) for args in arg_sets], reps)}
  if breakdown:
    timings["kernels_fwd"] = kernel_summary(lambda: jax.block_until_ready(fwd(arg_sets[0])))
    timings["kernels_fwd_bwd"] = kernel_summary(lambda: jax.block_until_ready(step(arg_sets[0], readout, None)))
  return timings, np.asarray(fwd(arg_sets[0]), np.float32)


def run_sweep(mixers, impls, shapes, *, H, K, V, dtype, chunk_size=(None,), reps=20, seed=0, peer=True,
              peer_modes=("plain",), bounded=False, compile_threads=1, breakdown=False, log=print, on_progress=None):
  """Times every (mixer, impl, chunk size, shape), shape by shape, and the fla peer in each of `peer_modes` where
  `peer` and it loads; with breakdown, also each run's kernels (`time_impl`).

  chunk_size: the chunk sizes to time, None for each impl's rule. Where a peer mode bounds the log decay from below
  (`fla_peer.lower_bound`), every input set's g is clipped there, for ours and the peer's alike. bounded: each
  program of an impl that uses the op's lower_bound is timed again with it, the bound of the peer's modes (of its
  safe_gate mode where none of them has one; g clipped there too), for the mixers whose decay is per channel.
  Returns (records, peer_notes {peer: description or why skipped}). Our records carry `chunk_size` (the size the
  impl ran at), `lower_bound` (None, or the bound the op was given) and `vs_peer_fwd` / `vs_peer_fwd_bwd` (and the
  host clock's) = the fastest peer mode's ms / our ms
  (above 1: faster than the peer), `vs_peer_<part>_mode` naming that mode. on_progress(records, peer_notes), if
  given, is called after every mixer at every shape, so that a sweep cut off by a time limit still leaves what it
  measured.
  """
  records, peer_notes, peer_ops = [], {}, {}
  bound = fla_peer.lower_bound(peer_modes) if peer else None
  if bounded and bound is None:
    bound = fla_peer.lower_bound(("safe_gate",))
  for B, T in shapes:
    for mixer in mixers:
      for mode in peer_modes if peer else ():
        name = f"{mixer} {fla_peer.peer_name(mode)}"
        if name not in peer_notes:
          peer_ops[name], peer_notes[name] = fla_peer.load_peer(mixer, mode)
          log(f"peer {name}: {peer_notes[name]}")
      # A decay per head has no bound to take (its grams are plain dots already): bounded times per-channel ones.
      bounds = (None, bound) if bounded and ops.MIXERS[mixer].decay == "key" else (None,)
      programs = [(impl, C, lower_bound) for impl in impls for C in (chunk_size if impl != "scan" else (None,))
                  for lower_bound in (bounds if _uses_lower_bound(impl) else (None,))]
      ours, o_ref = [], None
      try:
        built = [make_op_inputs(mixer, B, T, H, K, V, dtype, seed + 10 * i, initial_state=False)
                 for i in range(INPUT_SETS)]
        fn, arg_sets = built[0][0], [args for _, args in built]
        if bound is not None:
          arg_sets = [{**args, "g": jax.numpy.maximum(args["g"], bound)} for args in arg_sets]
        readout, _ = make_readouts(B, T, H, K, V, dtype, seed, state=False)
      except Exception as error:
        records += [_record(mixer, impl, B, T, error=error_text(error), chunk_size=C, lower_bound=lower_bound)
                    for impl, C, lower_bound in programs]
        continue
      compiled = {}
      if compile_threads > 1:
        log(f"{mixer} {B}x{T}: compiling {len(programs)} programs, {compile_threads} at once...")
        compiled = compile_all(fn, arg_sets[0], readout, programs, compile_threads)
      for program in programs:
        impl, C, lower_bound = program
        label = f"{mixer} {impl}{'' if C is None else f' C={C}'}{_bounded_suffix(lower_bound)} {B}x{T}"
        log(f"{label}: {'timing' if compiled else 'compiling and timing'}...")
        chunk = _chunk_of(impl, C, T)
        try:
          if isinstance(compiled.get(program), Exception):
            raise compiled[program]
          timings, o = time_impl(fn, arg_sets, readout, impl, C, reps, breakdown, compiled.get(program), lower_bound)
          ours.append(_record(mixer, impl, B, T, timings, chunk_size=chunk, lower_bound=lower_bound))
          o_ref = o if o_ref is None else o_ref
        except Exception as error:
          ours.append(_record(mixer, impl, B, T, error=error_text(error), chunk_size=chunk, lower_bound=lower_bound))
          log(f"  failed: {ours[-1]['error']}")
      del compiled
      records += ours
      if on_progress is not None:  # before the peer, whose autotuning can outlast a time limit
        on_progress(records, peer_notes)
      peers = []
      for mode in peer_modes if peer else ():
        op = peer_ops[f"{mixer} {fla_peer.peer_name(mode)}"]
        if op is not None:
          log(f"{mixer} {fla_peer.peer_name(mode)} {B}x{T}: timing...")
          peers.append(_time_peer_config(op, mixer, fla_peer.peer_name(mode), B, T, arg_sets, readout, reps, o_ref,
                                         breakdown))
          records.append(peers[-1])
          _compare_with_peers(ours, peers)
          if on_progress is not None:
            on_progress(records, peer_notes)
  return records, peer_notes


def _time_peer_config(peer_op, mixer, name, B, T, arg_sets, readout, reps, o_ref, breakdown=False):
  try:
    host_sets = [{key: np.asarray(x) for key, x in args.items()} for args in arg_sets]
    timings, o = fla_peer.time_peer(peer_op, host_sets, np.asarray(readout), reps, breakdown)
  except Exception as error:
    return _record(mixer, name, B, T, error=error_text(error), chunk_size=None)
  # The peer must compute what we compute, or the ratio means nothing.
  rel = None if o_ref is None else relative_error(o, o_ref)
  return _record(mixer, name, B, T, timings, chunk_size=None, out_rel_err_vs_ours=rel)


def _compare_with_peers(ours, peers):
  """Sets each of our records' vs_peer_<part> (the fastest peer's ms / ours) and vs_peer_<part>_mode."""
  for part in ("fwd", "fwd_bwd", "fwd_host", "fwd_bwd_host"):
    timed = [p for p in peers if p.get(f"{part}_ms")]
    if not timed:
      continue
    fastest = min(timed, key=lambda p: p[f"{part}_ms"])
    for record in ours:
      if record[f"{part}_ms"]:
        record[f"vs_peer_{part}"] = fastest[f"{part}_ms"] / record[f"{part}_ms"]
        record[f"vs_peer_{part}_mode"] = fastest["impl"]


def _note(r):
  if r.get("out_rel_err_vs_ours") is not None:
    return f"o rel err vs ours {r['out_rel_err_vs_ours']:.1e}"
  return r["error"] or ""


# One row per (mixer, impl, chunk size, shape).
COLUMNS = (
    Column("mixer", "mixer"), Column("impl", name_of), Column("C", "chunk_size", "d"),
    Column("B x T", lambda r: f"{r['B']}x{r['T']}"),
    Column("fwd ms", "fwd_ms", ".3f"), Column("fwd Mtok/s", "fwd_tokens_per_s", ".2f", 1e6),
    Column("fwd+bwd ms", "fwd_bwd_ms", ".3f"), Column("fwd+bwd Mtok/s", "fwd_bwd_tokens_per_s", ".2f", 1e6),
    Column("vs fla fwd", "vs_peer_fwd", ".2f", suffix="x"),
    Column("vs fla fwd+bwd", "vs_peer_fwd_bwd", ".2f", suffix="x"),
    Column("back to back fwd / fwd+bwd ms", lambda r: (r.get("fwd_host_ms"), r.get("fwd_bwd_host_ms")), ".3f"),
    Column("vs fla back to back", lambda r: (r.get("vs_peer_fwd_host"), r.get("vs_peer_fwd_bwd_host")), ".2f",
           suffix="x"),
    Column("note", _note))


def format_table(records):
  """A markdown table: one row per (mixer, impl, chunk size, shape)."""
  return table(COLUMNS, records)


SUMMARY_TITLE = "## Each chunk size and peer mode, fwd / fwd+bwd ms"


def summary_table(records):
  """One row per (mixer, B x T, clock): "fwd / fwd+bwd" ms of each of our (impl, chunk size) and each peer mode,
  which of ours is fastest for each part, and its time over the fastest peer mode's (below 1: ours faster);
  "" when the run timed one program of ours and at most one peer mode."""
  column = lambda r: r["impl"] if r["impl"].startswith(PEER) else (name_of(r), r.get("chunk_size") or 0)
  ours = sorted({column(r) for r in records if not r["impl"].startswith(PEER)})
  peers = sorted({column(r) for r in records if r["impl"].startswith(PEER)})
  if len(ours) < 2 and len(peers) < 2:
    return ""
  names = [f"{impl} C{chunk}" if chunk else impl for impl, chunk in ours] + peers
  rows = []
  for mixer, B, T in dict.fromkeys((r["mixer"], r["B"], r["T"]) for r in records):
    at = {column(r): r for r in records if (r["mixer"], r["B"], r["T"]) == (mixer, B, T) and not r["error"]}
    for clock, suffix in (("device", ""), ("host", "_host")):
      ms = lambda r, part: r.get(f"{part}{suffix}_ms") if r else None
      pair = lambda r: None if ms(r, "fwd") is None else (ms(r, "fwd"), ms(r, "fwd_bwd"))
      row = {"mixer": mixer, "B x T": f"{B}x{T}", "clock": clock,
             **{name: pair(at.get(k)) for name, k in zip(names, ours + peers)}}
      fastest, ratios = [], []
      for part in ("fwd", "fwd_bwd"):
        mine = [at[k] for k in ours if ms(at.get(k), part)]
        theirs = [ms(at[k], part) for k in peers if ms(at.get(k), part)]
        best = min(mine, key=lambda r: ms(r, part)) if mine else None
        fastest.append(None if best is None else names[ours.index(column(best))])
        ratios.append(ms(best, part) / min(theirs) if best is not None and theirs else None)
      rows.append({**row, "ours fastest": tuple(fastest), "ours fastest / peer fastest": tuple(ratios)})
  columns = [Column(name, name) for name in ("mixer", "B x T", "clock")]
  columns += [Column(name, name, ".3f") for name in names]
  columns += [Column("ours fastest", "ours fastest"),
              Column("ours fastest / peer fastest", "ours fastest / peer fastest", ".2f")]
  return table(columns, rows)


def plot_throughput(records, path):
  """tokens/s against sequence length, forward and forward+backward, a line per (mixer, impl, chunk size)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
  series = sorted({(r["mixer"], name_of(r), r.get("chunk_size") or 0) for r in records})
  seq_lens = sorted({r["T"] for r in records})
  for ax, part, title in zip(axes, ("fwd", "fwd_bwd"), ("forward", "forward + backward")):
    for mixer, impl, chunk in series:
      points = sorted((r["T"], r[f"{part}_tokens_per_s"]) for r in records
                      if (r["mixer"], name_of(r), r.get("chunk_size") or 0) == (mixer, impl, chunk)
                      and r[f"{part}_tokens_per_s"])
      if points:
        ax.plot(*zip(*points), marker="o", linestyle="--" if impl.startswith(PEER) else "-",
                label=f"{mixer} {impl}" + (f" C={chunk}" if chunk else ""))
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
    try:
      with open(path) as f:
        runs.append(json.load(f))
      runs[-1]["results"], runs[-1]["date"], runs[-1]["command"]  # noqa: B018 (what a report holds)
    except (OSError, ValueError, KeyError, TypeError) as error:
      raise ValueError(f"merge: {path!r}: expected the JSON report of an ops run ({type(error).__name__}: "
                       f"{error})") from None
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


def write_report(records, meta, out_dir, tag):
  """Writes <out_dir>/<date>_<tag>.{json,md,png}; returns their paths."""
  notes = [f"- peer {name}: {note}" for name, note in meta.get("peer", {}).items()]
  notes += ["- vs fla = the fastest fla mode's ms / our ms (above 1: faster than fla); Mtok/s = B*T / time"]
  if meta.get("config", {}).get("breakdown") and not any(r.get("kernels_fwd") for r in records):
    notes += [NO_KERNELS]
  body = format_table(records)
  summary = summary_table(records)
  if summary:
    body += f"\n\n{SUMMARY_TITLE}\n\n{summary}"
  body += kernel_section(records, lambda r: f"{r['mixer']} {name_of(r)} {r['B']}x{r['T']}", KERNEL_PARTS)
  paths = write_tables(records, meta, out_dir, tag, "Op throughput", notes, body)
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
      dtype=s.dtype, chunk_size=chunk_sizes(s.chunk_size), reps=s.reps, seed=s.seed, peer=s.peer,
      peer_modes=s.peer_modes, bounded=s.bounded, compile_threads=s.compile_threads, breakdown=s.breakdown, log=log,
      on_progress=report)
  paths = report(records, peer_notes)
  log("\nwrote " + ", ".join(paths.values()))
  log(f"\n{meta['device']}, {s.dtype}, H={s.heads} K={s.head_dim}; vs fla = fla's fastest mode's ms / our ms\n"
      + format_table(records))
  summary = summary_table(records)
  if summary:
    log(f"\n{SUMMARY_TITLE} ({meta['device']}; device: {meta['timer']})\n{summary}")
  return records, paths


def merge(json_paths, out_dir, tag, log=print):
  """One report (table, plot) of the `ops` reports of several runs (`merge_reports`); returns its paths."""
  records, meta = merge_reports(json_paths)
  paths = write_report(records, meta, out_dir, tag)
  log("wrote " + ", ".join(paths.values()) + "\n" + format_table(records))
  return paths
