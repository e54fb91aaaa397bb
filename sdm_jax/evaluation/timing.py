"""Timing jitted functions on the device, and recording where and how a measurement was made."""

import datetime
import json
import os
import statistics
import sys
import time

import jax


def compile_timed(fn, *args):
  """Lowers and compiles jax.jit(fn) for `args`; returns (compiled, seconds)."""
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  return compiled, time.perf_counter() - start


def median_ms(fn, arg_sets, reps):
  """Median wall time in ms of fn(*arg_sets[i % len(arg_sets)]) over `reps` runs.

  Each input set is run once first (warm-up); every run is synchronised with
  jax.block_until_ready. Rotating input sets keeps caches from flattering the numbers.
  """
  for args in arg_sets:
    jax.block_until_ready(fn(*args))
  times = []
  for i in range(reps):
    args = arg_sets[i % len(arg_sets)]
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def error_text(error):
  """'<type>: <first line, at most 200 characters>': how a failed measurement is recorded."""
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"


def run_metadata():
  """Date, device and command line of this run, for every file a measuring tool writes."""
  device = jax.devices()[0]
  return {
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "device": device.device_kind,
      "backend": jax.default_backend(),
      "jax_version": jax.__version__,
      "command": " ".join(["python", "-m", _module_name()] + sys.argv[1:]),
  }


def _module_name():
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  return spec.name if spec is not None else sys.argv[0]


def write_tables(records, meta, out_dir, tag, title, notes, table):
  """Writes <out_dir>/<date>_<tag>.json ({**meta, "results": records}) and .md (title, the run's date,
  device, jax version, command and config, `notes` lines, then `table`).

  Returns {"json", "md", "png"}: the paths of the report, the plot's for the caller to draw.
  """
  os.makedirs(out_dir, exist_ok=True)
  base = os.path.join(out_dir, f"{meta['date'][:10]}_{tag}")
  paths = {ext: f"{base}.{ext}" for ext in ("json", "md", "png")}
  with open(paths["json"], "w") as f:
    json.dump({**meta, "results": records}, f, indent=2)
  header = [f"# {title}: {tag}", ""]
  header += [f"- {key}: `{meta[key]}`" for key in ("date", "device", "jax_version", "command")]
  header += [f"- config: `{json.dumps(meta['config'])}`"] + list(notes) + [""]
  with open(paths["md"], "w") as f:
    f.write("\n".join(header) + "\n" + table + "\n")
  return paths
