"""What the probe scripts share: GDN-2-like inputs and a timer that collects a markdown table."""

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.benchmarking.timing import compile_timed, kernel_times, median_ms, timer_name


def gdn2_inputs(B, T, H, K, V, seed, dtype=jnp.float32):
  """[q, u = k, e = b * k, z = w * v] in `dtype` and g in fp32: unit q, k; sigmoid gates; softplus decay."""
  r = np.random.default_rng(seed)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q = unit(r.standard_normal((B, T, H, K), np.float32))
  k = unit(r.standard_normal((B, T, H, K), np.float32))
  v = r.standard_normal((B, T, H, V), np.float32)
  g = -np.logaddexp(0.0, -1.0 - r.standard_normal((B, T, H, K), np.float32))
  b = 1 / (1 + np.exp(-r.standard_normal((B, T, H, K), np.float32)))
  w = 1 / (1 + np.exp(-r.standard_normal((B, T, H, V), np.float32)))
  return [jnp.asarray(x, dtype) for x in (q, k, b * k, w * v)] + [jnp.asarray(g, jnp.float32)]


def gdn2_probe(shape_arg):
  """The probes' shared setup from 'B,T,H': (B, T, H, K = V = 128, bf16, scale, interpret, 3 input sets),
  with a header line naming the device and the timer."""
  B, T, H = (int(x) for x in shape_arg.split(","))
  K, dtype = 128, jnp.bfloat16
  print(f"B={B} T={T} H={H} K=V={K} bf16; {jax.devices()[0].device_kind}; timer: {timer_name()}", flush=True)
  return B, T, H, K, dtype, K**-0.5, jax.default_backend() != "gpu", [gdn2_inputs(B, T, H, K, K, s, dtype)
                                                                       for s in range(3)]


class Timer:
  """timer(name, fn, arg_sets): compile, then the median of 10 warm runs; failures are printed, not raised."""

  def __init__(self):
    self.rows = []

  def __call__(self, name, fn, arg_sets):
    try:
      compiled, compile_s = compile_timed(fn, *arg_sets[0])
      ms = median_ms(compiled, arg_sets, 10)
      self.rows.append((name, compile_s, ms))
      print(f"{name:<48} compile {compile_s:6.1f} s  {ms:8.3f} ms", flush=True)
      return compiled
    except Exception as error:
      self.rows.append((name, float("nan"), float("nan")))
      print(f"{name:<48} FAILED {type(error).__name__}: {str(error).splitlines()[0][:300]}", flush=True)

  def table(self, what):
    lines = [f"| {what} | compile s | ms |", "|---|---|---|"]
    lines += [f"| {name} | {c:.1f} | {ms:.3f} |" for name, c, ms in self.rows]
    return "\n".join(lines)


def breakdown(name, fn, args, top=12, sync=jax.block_until_ready):
  """Prints the kernels of one run of fn(*args) by device time (CUPTI), same-named kernels summed."""
  try:
    totals = {}
    for kernel, ms in kernel_times(lambda: sync(fn(*args))):
      totals[kernel] = totals.get(kernel, 0.0) + ms
  except Exception as error:
    print(f"breakdown of {name} FAILED {type(error).__name__}: {str(error).splitlines()[0][:200]}", flush=True)
    return
  print(f"\nkernels of {name}: {sum(totals.values()):.3f} ms in {len(totals)} distinct kernels", flush=True)
  for kernel, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:top]:
    print(f"  {ms:8.3f} ms  {kernel[:100]}", flush=True)
