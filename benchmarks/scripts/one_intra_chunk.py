"""Runs the pallas op's forward and backward once after compiling (GDN-2 inputs, 4x4096, H 16,
K = V = 128, bf16, chunk from argv, default 64), for a profiler such as Nsight Compute to attach to
(probe, 2026-11-29 session 6).

  ncu -k regex:intra_chunk -c 2 --section Occupancy ... python3 benchmarks/scripts/one_intra_chunk.py 64
"""
import sys

import jax
import jax.numpy as jnp

from pallas_kernels.mixer_inputs import FORMED
from sdm_jax.ops.pallas import delta_rule_pallas

from probe_common import gdn2_inputs

C = int(sys.argv[1]) if len(sys.argv) > 1 else 64
args = gdn2_inputs(4, 4096, 16, 128, 128, 0, jnp.bfloat16)
h0 = jnp.zeros((4, 16, 128, 128), jnp.float32)
loss = lambda q, u, e, z, g: jnp.sum(delta_rule_pallas(FORMED, q, u, z, (e,), g, 128**-0.5, h0, C,
                                                      jnp.bfloat16)[0].astype(jnp.float32))
step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4))).lower(*args).compile()
jax.block_until_ready(step(*args))
print("done", flush=True)
