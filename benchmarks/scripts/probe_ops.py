"""Probe (2026-11-30, session 7): the whole op of ours (impl="pallas") and of fla, kernel by kernel, in one
process at one shape, so each of our kernels can be set against the fla stage it competes with.

  OPS_CHUNK=32 PYTHONPATH=. python3 benchmarks/scripts/probe_ops.py gdn2,kda 4x4096

OPS_CHUNK: our chunk size (default 64; fla runs at its own). OPS_HLO: a folder to write our forward's optimized
HLO to (<mixer>_fwd.hlo), which names what each XLA fusion does.

Inputs from `op_inputs.make_op_inputs` (H 16, K = V = 128, bf16, as bench_ops); forward, and forward +
backward with cotangent r for o. Per kernel: device time of one warm run (CUPTI), same-named kernels summed.
"""
import os
import sys
import warnings

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")  # torch shares the card; see bench_ops
warnings.filterwarnings("ignore")

import jax
import numpy as np

from sdm_jax.benchmarking import fla_peer
from sdm_jax.benchmarking.op_inputs import make_loss, make_op_inputs, make_readouts

from probe_common import breakdown

mixers, shape = sys.argv[1].split(","), sys.argv[2]
B, T = (int(n) for n in shape.split("x"))
H, K = 16, 128
chunk = int(os.environ.get("OPS_CHUNK", "64"))
for mixer in mixers:
  fn, args = make_op_inputs(mixer, B, T, H, K, K, "bfloat16", 0, initial_state=False)
  readout, _ = make_readouts(B, T, H, K, K, "bfloat16", 0, state=False)
  fwd = jax.jit(lambda a: fn(a, impl="pallas", chunk_size=chunk)[0])
  step = jax.jit(jax.grad(make_loss(fn, "pallas", chunk), has_aux=True))
  if os.environ.get("OPS_HLO"):
    with open(os.path.join(os.environ["OPS_HLO"], f"{mixer}_fwd.hlo"), "w") as f:
      f.write(fwd.lower(args).compile().as_text())
  for run in range(2):  # the first run compiles
    breakdown(f"{mixer} {shape} ours fwd, chunk {chunk} (run {run})", fwd, (args,))
    breakdown(f"{mixer} {shape} ours fwd+bwd, chunk {chunk} (run {run})", step, (args, readout, None))
  op, note = fla_peer.load_peer(mixer)
  print(f"peer: {note}", flush=True)
  if op is None:
    continue
  import torch
  (xs,), peer_fwd, peer_step, sync = fla_peer.peer_calls(op, [args], np.asarray(readout))
  for run in range(3):  # fla autotunes on its first runs
    breakdown(f"{mixer} {shape} fla fwd (run {run})", peer_fwd, xs, top=20, sync=sync)
    breakdown(f"{mixer} {shape} fla fwd+bwd (run {run})", peer_step, xs, top=30, sync=sync)
  del xs
  torch.cuda.empty_cache()
