"""Probe: what packing documents into rows (segment_ids, DESIGN.md section 9) costs the SDM op. sparse_delta_rule,
forward and forward + backward, on the same inputs unpacked and as rows of `docs` documents each (boundaries drawn
at random), with the ratio packed / unpacked. The packed gradients are checked finite only (their accuracy against
the documents run alone is tests/ops/test_sparse_packed.py's).

  PYTHONPATH=. python3 benchmarks/scripts/probe_sdm_packed.py                      # B 4, T 4096, H 2, N 65,536,
                                                                                     # V 1,024, W = R = 128
  PYTHONPATH=. python3 benchmarks/scripts/probe_sdm_packed.py 1,64,2,256,32,16      # any B,T,H,N,V,W (R = W)
  SDM_PACKED_DOCS=8 SDM_PACKED_IMPL=pallas SDM_OPTIONS=float32:1 (the defaults; options as sdm_train_memory.py:
  rows_dtype:rows_segments[:table_dtype], comma-separated)

Inputs from `sdm_bench.sdm_inputs` (bf16 v, fp32 m0 shared over the batch); forward+backward is the gradient of
sum(o * r) with respect to every float input, the final table unused as in training. Two timers (DESIGN.md section
7): the device's (`timing.median_ms`: the sum of the kernels' durations from CUPTI, median of REPS runs rotating 3
input sets) and the host clock around REPS back-to-back calls with one synchronisation at the end. Off a GPU it runs
in interpret mode (a smoke test: use a small shape).
"""
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.benchmarking.sdm_bench import sdm_inputs
from sdm_jax.benchmarking.timing import back_to_back_ms, median_ms, peak_device_bytes, timer_name
from sdm_jax.ops import sparse_delta_rule

REPS = int(os.environ.get("SDM_PACKED_REPS", "10"))
B, T, H, N, V, W = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "4,4096,2,65536,1024,128").split(","))
DOCS = int(os.environ.get("SDM_PACKED_DOCS", "8"))
IMPL = os.environ.get("SDM_PACKED_IMPL", "pallas")
OPTIONS = [(f[0], int(f[1]), f[2] if len(f) > 2 else "float32")
           for f in (s.split(":") for s in os.environ.get("SDM_OPTIONS", "float32:1").split(","))]


def document_ids(docs, seed=0):
  """[B, T] int32: each row cut into `docs` documents at random distinct positions."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((B, T), np.int32)
  for b in range(B):
    cuts = np.sort(rng.choice(np.arange(1, T), size=docs - 1, replace=False))
    ids[b] = 1 + np.searchsorted(cuts, np.arange(T), side="right")
  return jnp.asarray(ids)


def calls(option):
  rows_dtype, rows_segments, table_dtype = option
  kw = dict(impl=IMPL, rows_dtype=rows_dtype, rows_segments=rows_segments, table_dtype=table_dtype)

  def forward(floats, ints, r_o, segment_ids):
    return sparse_delta_rule(**floats, **ints, segment_ids=segment_ids, **kw)[0]

  def loss(floats, ints, r_o, segment_ids):
    return jnp.sum(forward(floats, ints, r_o, segment_ids).astype(jnp.float32) * r_o)

  return jax.jit(forward), jax.jit(jax.value_and_grad(loss))


def host_ms(fn, args):
  return back_to_back_ms(fn, args, REPS)


def main():
  print(f"B={B} T={T} H={H} N={N} V={V} W=R={W}, {DOCS} documents per row, impl={IMPL}; "
        f"{jax.devices()[0].device_kind}; timers: {timer_name()} | host clock, {REPS} back to back", flush=True)
  ids = document_ids(DOCS)
  sets = [sdm_inputs(B, T, H, N, V, W, W, 10 * i) for i in range(3)]
  r_o = jnp.asarray(np.random.default_rng(1).standard_normal((B, T, H, V), np.float32))
  rows = []
  for option in OPTIONS:
    forward, step = calls(option)
    _, grads = step(*sets[0], r_o, ids)
    finite = all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    for part, fn in (("fwd", forward), ("fwd+bwd", step)):
      timed = {}
      for name, segment_ids in (("unpacked", None), ("packed", ids)):
        device = median_ms(fn, [(*s, r_o, segment_ids) for s in sets], REPS)
        timed[name] = (device, host_ms(fn, (*sets[0], r_o, segment_ids)))
      ratio = [timed["packed"][i] / timed["unpacked"][i] for i in range(2)]
      rows.append((":".join(map(str, option)), part, *timed["unpacked"], *timed["packed"], *ratio))
      print(f"{rows[-1][0]} {part:>7}: unpacked {timed['unpacked'][0]:.2f} / {timed['unpacked'][1]:.2f} ms, packed "
            f"{timed['packed'][0]:.2f} / {timed['packed'][1]:.2f} ms, ratio {ratio[0]:.3f} / {ratio[1]:.3f}"
            f"{'' if finite else ', PACKED GRADIENTS NOT FINITE'}", flush=True)
  peak = peak_device_bytes()
  print(f"\npeak bytes in use (the process, every option): {'-' if peak is None else f'{peak / 1e9:.2f} GB'}")
  print("\n| option | part | unpacked ms (device / host) | packed ms (device / host) | packed / unpacked |")
  print("|---|---|---|---|---|")
  for option, part, ud, uh, pd, ph, rd, rh in rows:
    print(f"| {option} | {part} | {ud:.2f} / {uh:.2f} | {pd:.2f} / {ph:.2f} | {rd:.3f} / {rh:.3f} |")


if __name__ == "__main__":
  main()
