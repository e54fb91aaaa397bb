"""Timing jitted functions on the device, and recording where and how a measurement was made."""

import datetime
import os
import statistics
import sys
import time

import jax

from sdm_jax.ops.validation import on_gpu


def compile_timed(fn, *args):
  """Lowers and compiles jax.jit(fn) for `args`; returns (compiled, seconds)."""
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  return compiled, time.perf_counter() - start


def _cupti():
  """jax's CUPTI binding (the Mosaic GPU extension), or None off the GPU or where it is missing."""
  if not on_gpu():
    return None
  try:
    from jax._src.lib import mosaic_gpu
    return mosaic_gpu._mosaic_gpu_ext
  except (ImportError, AttributeError):
    return None


def kernel_timer_available():
  """Whether `kernel_times` (and `median_ms`'s device timer) works here: a GPU with jax's CUPTI binding."""
  return _cupti() is not None


def timer_name():
  """How `median_ms` measures on this backend (written into every report)."""
  if kernel_timer_available():
    return "device: sum of the kernels' durations from CUPTI (gaps between kernels not counted)"
  return "host wall clock around one synchronised call"


def kernel_times(run):
  """[(kernel name, ms)] of every GPU kernel that run() launches (run must synchronise), from CUPTI.

  CUPTI records every kernel of the process while it is on, so this times jax and torch alike.
  """
  ext = _cupti()
  if ext is None:
    raise RuntimeError("kernel_times needs a GPU and jax's CUPTI binding")
  ext._cupti_init()
  try:
    run()
  finally:
    timings = ext._cupti_get_timings(True)
  return list(timings or [])


def kernel_summary(run, top=12):
  """{"total_ms", "kernels", "top": [(kernel name, ms)]} of one synchronised run(), same-named kernels summed,
  the `top` largest first (CUPTI); None where `kernel_timer_available` is not (a report notes why)."""
  if not kernel_timer_available():
    return None
  sums = {}
  for name, ms in kernel_times(run):
    sums[name] = sums.get(name, 0.0) + ms
  ordered = sorted(sums.items(), key=lambda item: -item[1])
  return {"total_ms": sum(sums.values()), "kernels": len(sums), "top": ordered[:top]}


def peak_device_bytes(every_device=False):
  """The first device's peak bytes in use since the process started (JAX cannot reset it), or with every_device
  the largest over the process's devices (per GPU, the number that must fit); None where the backend keeps no
  memory statistics (the CPU)."""
  peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in (jax.local_devices() if every_device
                                                                          else jax.devices()[:1])]
  peaks = [p for p in peaks if p is not None]
  return max(peaks) if peaks else None


def median_ms(fn, arg_sets, reps, sync=jax.block_until_ready):
  """Median time in ms of fn(*arg_sets[i % len(arg_sets)]) over `reps` runs, each synchronised by
  sync(result).

  On the GPU a run's time is the summed device duration of its kernels (CUPTI; `timer_name`), so host
  dispatch does not count; elsewhere it is the wall time of the call. Each input set runs once first
  (warm-up); rotating input sets keeps caches from flattering the numbers.
  """
  for args in arg_sets:
    sync(fn(*args))
  device = kernel_timer_available()
  times = []
  for i in range(reps):
    args = arg_sets[i % len(arg_sets)]
    if device:
      times.append(sum(ms for _, ms in kernel_times(lambda: sync(fn(*args)))))
      continue
    start = time.perf_counter()
    sync(fn(*args))
    times.append(1e3 * (time.perf_counter() - start))
  return statistics.median(times)


def back_to_back_ms(fn, arg_sets, reps, sync=jax.block_until_ready):
  """The host clock around `reps` back-to-back calls of fn(*arg_sets[i % len(arg_sets)]) after a warm call of each
  set, one sync(result) at the end, per call (ms): what a training loop sees, launch gaps and dispatch included
  (DESIGN.md section 7's second timer)."""
  for args in arg_sets:
    sync(fn(*args))
  start = time.perf_counter()
  for i in range(reps - 1):
    fn(*arg_sets[i % len(arg_sets)])
  sync(fn(*arg_sets[(reps - 1) % len(arg_sets)]))
  return 1e3 * (time.perf_counter() - start) / reps


def error_text(error):
  """'<type>: <first line, at most 200 characters>': how a failed measurement is recorded."""
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"


def run_metadata():
  """Date, device, command line and the package directory (which tree ran) of this run, for every file a
  measuring tool writes."""
  import sdm_jax
  device = jax.devices()[0]
  return {
      "package_dir": os.path.dirname(os.path.abspath(sdm_jax.__file__)),
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
      "device": device.device_kind,
      "backend": jax.default_backend(),
      "jax_version": jax.__version__,
      "timer": timer_name(),
      "command": command_line(),
  }


def command_line():
  """This process's command line as it was typed: 'python -m <module> <arguments>'."""
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  return " ".join(["python", "-m", spec.name if spec is not None else sys.argv[0]] + sys.argv[1:])
