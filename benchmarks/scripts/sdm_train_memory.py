"""GPU check: the SDM op's training memory, time and accuracy at the paper's layer shape, for each choice of what its
backward gets the saved rows from and what the table is stored in
(`sparse_delta_rule(impl="pallas", rows_dtype=..., rows_segments=..., table_dtype=...)`).

  PYTHONPATH=. python3 benchmarks/scripts/sdm_train_memory.py                 # B 4, T 4096, H 2, N 65,536, V 1,024, W = R = 128
  PYTHONPATH=. python3 benchmarks/scripts/sdm_train_memory.py 1,256,2,4096,128,32   # any B,T,H,N,V,W (R = W); off a GPU
                                                                                    # compiled memory only (interpret mode)

SDM_OPTIONS: rows_dtype:rows_segments[:table_dtype] (default float32:1,bfloat16:1,float32:1:bfloat16,float32:2,
bfloat16:2,float32:4,bfloat16:4). On a GPU each option's o and gradients are compared with the first option's (relative
Frobenius error; the worst gradient named), and its forward+backward is the median of 5 timed calls.
Per option: the bytes jax.vjp of the op saves for its backward (m0 left out: it is the parameter itself), XLA's compiled
memory of jit(value_and_grad(loss)) (temp, argument, output; loss = sum(o * r_o), the final table unused as in
training), and on a GPU the process's peak_bytes_in_use after the option has run. The peak counter cannot be
reset, so the options run in ascending order of saved bytes: an option's peak is its own when it exceeds every earlier one ('<=' marks one that did not).
"""
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.benchmarking.sdm_bench import sdm_inputs
from sdm_jax.benchmarking.timing import peak_device_bytes
from sdm_jax.ops import sparse_delta_rule

B, T, H, N, V, W = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "4,4096,2,65536,1024,128").split(","))
OPTIONS = [(f[0], int(f[1]), f[2] if len(f) > 2 else "float32") for f in (s.split(":") for s in os.environ.get(
    "SDM_OPTIONS", "float32:1,bfloat16:1,float32:1:bfloat16,float32:2,bfloat16:2,float32:4,bfloat16:4").split(","))]
on_gpu = jax.default_backend() == "gpu"
UNIT, SCALE = ("GB", 1e9) if B * H * T * W * V * 4 > 1e9 else ("MB", 1e6)  # reduced shapes in MB


def forward(floats, ints, rows_dtype, rows_segments, table_dtype):
  return sparse_delta_rule(**floats, **ints, impl="pallas", output_final_state=True, rows_dtype=rows_dtype,
                           rows_segments=rows_segments, table_dtype=table_dtype)[0]


def loss(floats, ints, r_o, *option):
  o = forward(floats, ints, *option)
  return jnp.sum(o.astype(jnp.float32) * r_o), o


def relative_error(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def saved_bytes(floats, ints, option):
  """Bytes of what jax.vjp of the op keeps for the backward, m0 (the parameter, held anyway) left out."""
  vjp = jax.eval_shape(lambda fl, it: jax.vjp(lambda f: forward(f, it, *option), fl)[1], floats, ints)
  leaves = [x for x in jax.tree.leaves(vjp) if (x.shape, x.dtype) != (floats["m0"].shape, floats["m0"].dtype)]
  return sum(x.size * x.dtype.itemsize for x in leaves)


def main():
  kind = jax.devices()[0].device_kind
  rows = B * H * T * W * V
  print(f"B={B} T={T} H={H} N={N} V={V} W=R={W}; {kind}; rows B H T W V = {rows * 4 / SCALE:.2f} {UNIT} fp32, table "
        f"B H N V = {B * H * N * V * 4 / SCALE:.2f} {UNIT} fp32", flush=True)
  if on_gpu:
    floats, ints = sdm_inputs(B, T, H, N, V, W, W, 0)
    r_o = jnp.asarray(np.random.default_rng(1).standard_normal((B, T, H, V), np.float32))
    print(f"inputs on the device: {jax.devices()[0].memory_stats()['bytes_in_use'] / SCALE:.2f} {UNIT}", flush=True)
  else:  # abstract inputs: the compiled memory needs no values
    floats, ints = jax.eval_shape(lambda: sdm_inputs(B, T, H, N, V, W, W, 0))
    r_o = jax.ShapeDtypeStruct((B, T, H, V), jnp.float32)
  saved = {option: saved_bytes(floats, ints, option) for option in OPTIONS}
  rows_out, results = {}, {}  # option -> its table row's leading cells; on a GPU, (o, gradients) on the host
  peak_so_far = 0
  for option in sorted(OPTIONS, key=lambda o: saved[o]):
    step = jax.jit(jax.value_and_grad(lambda fl, it, r: loss(fl, it, r, *option), has_aux=True))
    start = time.perf_counter()
    compiled = step.lower(floats, ints, r_o).compile()
    compile_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    peak, ms = "-", "-"
    if on_gpu:
      try:
        (_, o), grads = compiled(floats, ints, r_o)
        results[option] = jax.device_get((o, grads))
        del o, grads
        times = []
        for _ in range(5):
          start = time.perf_counter()
          jax.block_until_ready(compiled(floats, ints, r_o))
          times.append(time.perf_counter() - start)
        ms = f"{np.median(times) * 1e3:.1f}"
        now = peak_device_bytes()
        peak = f"{now / SCALE:.2f}" if now > peak_so_far else f"<={now / SCALE:.2f}"
        peak_so_far = max(peak_so_far, now)
      except Exception as error:  # an option that does not fit is a result
        ms = f"FAILED {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    rows_out[option] = (f"| {option[0]} | {option[1]} | {option[2]} | {saved[option] / SCALE:.2f} | "
                        f"{mem.temp_size_in_bytes / SCALE:.2f} | {mem.argument_size_in_bytes / SCALE:.2f} | "
                        f"{mem.output_size_in_bytes / SCALE:.2f} | {peak} | {ms} |")
    print(f"{rows_out[option]}  (compile {compile_s:.1f} s)", flush=True)
  print()
  print(f"| rows_dtype | rows_segments | table_dtype | saved {UNIT} | temp {UNIT} | argument {UNIT} | output {UNIT} | "
        f"peak {UNIT} | fwd+bwd ms | o error | worst gradient error |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  reference = results.get(OPTIONS[0])
  for option in OPTIONS:
    o_error = grad_error = "-"
    if reference is not None and option in results and option != OPTIONS[0]:
      o, grads = results[option]
      o_error = f"{relative_error(o, reference[0]):.1e}"
      errors = {name: relative_error(grads[name], reference[1][name]) for name in grads}
      worst = max(errors, key=errors.get)
      grad_error = f"{errors[worst]:.1e} ({worst})"
    print(f"{rows_out[option]} {o_error} | {grad_error} |")

if __name__ == "__main__":
  main()
