"""Probe: what packing documents into rows (segment_ids, DESIGN.md section 9) costs the dense ops. Each mixer's op,
forward and forward + backward, on the same inputs unpacked and as rows of `docs` documents each (boundaries drawn
at random, so most start inside a chunk), with the ratio packed / unpacked: the target is <= 1.1.

  PYTHONPATH=. python3 benchmarks/scripts/probe_packed.py kda,gdn 4x4096
  PACKED_CHUNK=32,64 PACKED_DOCS=8 PACKED_IMPL=pallas PACKED_DIMS=16,128 (the defaults)

Inputs from `op_inputs.make_op_inputs` (bf16, K = V, no initial state); forward+backward is the gradient of
sum(o * r) with respect to every input. Two timers (DESIGN.md section 7): the device's (`timing.median_ms`: the sum of
the kernels' durations from CUPTI, median of 20 runs rotating 3 input sets) and the host clock around 20
back-to-back calls with one synchronisation at the end. On a CPU it runs (slowly, in interpret mode) as a smoke
test: PACKED_DIMS=2,32 ... probe_packed.py kda 1x128.
"""
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.benchmarking.op_inputs import make_op_inputs, make_readouts
from sdm_jax.benchmarking.timing import back_to_back_ms, median_ms, timer_name
from sdm_jax.ops import MIXERS

REPS = 20
TARGET = 1.1


def document_ids(B, T, docs, seed=0):
  """[B, T] int32: each row cut into `docs` documents at random distinct positions."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((B, T), np.int32)
  for b in range(B):
    cuts = np.sort(rng.choice(np.arange(1, T), size=docs - 1, replace=False))
    ids[b] = 1 + np.searchsorted(cuts, np.arange(T), side="right")
  return jnp.asarray(ids)


def calls(mixer, impl, chunk):
  """(forward, forward+backward), each (args, r_o, segment_ids or None) -> arrays to synchronise on."""
  def op(args, segment_ids):
    return MIXERS[mixer].op(**args, impl=impl, chunk_size=chunk, use_qk_l2norm=True, output_final_state=True,
                            segment_ids=segment_ids)

  def forward(args, r_o, segment_ids):
    return op(args, segment_ids)[0]

  def loss(args, r_o, segment_ids):
    return jnp.sum(op(args, segment_ids)[0].astype(jnp.float32) * r_o)

  return jax.jit(forward), jax.jit(jax.value_and_grad(loss))


def host_ms(fn, args):
  return back_to_back_ms(fn, args, REPS)


def main():
  mixers, shape = sys.argv[1].split(","), sys.argv[2]
  B, T = (int(n) for n in shape.split("x"))
  H, K = (int(n) for n in os.environ.get("PACKED_DIMS", "16,128").split(","))
  chunks = [int(c) for c in os.environ.get("PACKED_CHUNK", "32,64").split(",")]
  docs = int(os.environ.get("PACKED_DOCS", "8"))
  impl = os.environ.get("PACKED_IMPL", "pallas")
  print(f"B={B} T={T} H={H} K=V={K} bf16, {docs} documents per row, impl={impl}; {jax.devices()[0].device_kind}; "
        f"timers: {timer_name()} | host clock, {REPS} back to back", flush=True)
  ids = document_ids(B, T, docs)
  rows = []
  for mixer in mixers:
    arg_sets = [make_op_inputs(mixer, B, T, H, K, K, "bfloat16", 10 * i, initial_state=False)[1] for i in range(3)]
    r_o, _ = make_readouts(B, T, H, K, K, "bfloat16", 0, state=False)
    for chunk in chunks:
      forward, step = calls(mixer, impl, chunk)
      for part, fn in (("fwd", forward), ("fwd+bwd", step)):
        timed = {}
        for name, segment_ids in (("unpacked", None), ("packed", ids)):
          device = median_ms(fn, [(args, r_o, segment_ids) for args in arg_sets], REPS)
          timed[name] = (device, host_ms(fn, (arg_sets[0], r_o, segment_ids)))
        ratio = [timed["packed"][i] / timed["unpacked"][i] for i in range(2)]
        rows.append((mixer, chunk, part, *timed["unpacked"], *timed["packed"], *ratio))
        print(f"{mixer:>5} chunk {chunk} {part:>7}: unpacked {timed['unpacked'][0]:.3f} / {timed['unpacked'][1]:.3f}"
              f" ms, packed {timed['packed'][0]:.3f} / {timed['packed'][1]:.3f} ms, ratio {ratio[0]:.3f} / "
              f"{ratio[1]:.3f} {'ok' if max(ratio) <= TARGET else f'ABOVE {TARGET}'}", flush=True)
  print("\n| mixer | chunk | part | unpacked ms (device / host) | packed ms (device / host) | packed / unpacked |")
  print("|---|---|---|---|---|---|")
  for mixer, chunk, part, ud, uh, pd, ph, rd, rh in rows:
    print(f"| {mixer} | {chunk} | {part} | {ud:.3f} / {uh:.3f} | {pd:.3f} / {ph:.3f} | {rd:.3f} / {rh:.3f} |")


if __name__ == "__main__":
  main()
