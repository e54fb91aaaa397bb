"""Runs intra_chunk and intra_chunk_bwd (GDN-2 inputs, 4x4096, H 16, K = V = 128, bf16, chunk 64) a few
times, for a profiler such as Nsight Compute to attach to (probe, 2026-11-29 session 6).

  ncu -k regex:intra_chunk -c 2 --section Occupancy ... python3 benchmarks/scripts/one_intra_chunk.py
"""
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax
import jax.numpy as jnp

from pallas_kernels.delta_rule_fwd import intra_chunk

from probe_common import gdn2_inputs

C = int(sys.argv[1]) if len(sys.argv) > 1 else 64
q, u, e, z, g = gdn2_inputs(4, 4096, 16, 128, 128, 0, jnp.bfloat16)
for _ in range(2):
  jax.block_until_ready(intra_chunk(q, u, e, z, g, scale=128**-0.5, chunk_size=C, save_inverse=True))
print("done", flush=True)
