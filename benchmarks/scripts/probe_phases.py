"""Probe (2026-11-29, session 2): time each phase of the chunked forward and backward on one shape.

  PYTHONPATH=. python3 benchmarks/scripts/probe_phases.py 4,4096,16 bfloat16

Phases of GDN-2 (K = V = 128, chunk 64): the Pallas intra-chunk kernel, the XLA intra-chunk part
of the chunk impl (forward, and forward + vjp), the Pallas state pass, and the XLA lax.scan state
pass (forward, and forward + vjp). Median of 10 warm runs over 3 rotated input sets.
"""
import os
import sys
import warnings

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
warnings.filterwarnings("ignore")

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.delta_rule_fwd import intra_chunk, state_pass
from sdm_jax.ops.chunk import chunk_intra, chunk_step

from probe_common import Timer, gdn2_inputs

B, T, H = (int(x) for x in sys.argv[1].split(","))
dtype = jnp.dtype(sys.argv[2])
K = V = 128
C = 64
scale = K**-0.5
interpret = jax.default_backend() != "gpu"  # a CPU dry run of this script


sets = [gdn2_inputs(B, T, H, K, V, s) for s in range(3)]
io_sets = [[x.astype(dtype) for x in s[:4]] + [s[4]] for s in sets]
timed = Timer()

print(f"B={B} T={T} H={H} K=V={K} C={C} {dtype}; {jax.devices()[0].device_kind}", flush=True)
intra = timed("pallas intra_chunk", lambda *a: intra_chunk(*a, scale=scale, chunk_size=C, interpret=interpret), io_sets)
timed("xla chunk_intra fwd (fp32)", lambda *a: chunk_intra(*a, scale, C), sets)
timed("xla chunk_intra fwd+vjp (fp32)",
      lambda *a: jax.vjp(lambda *x: chunk_intra(*x, scale, C), *a)[1](chunk_intra(*a, scale, C)), sets)
y, w, aqk = intra(*io_sets[0])
h0 = jnp.zeros((B, H, K, V), jnp.float32)
pass_sets = [(s[0], s[1], s[4], y, w, aqk, h0) for s in io_sets]
for bv in (32, 64):
  timed(f"pallas state_pass block_v={bv}",
        lambda *a, bv=bv: state_pass(*a, scale=scale, chunk_size=C, block_v=bv, interpret=interpret), pass_sets)
chunks = [jax.jit(lambda *a: chunk_intra(*a, scale, C))(*s) for s in sets[:1]]
scan = lambda ch: jax.lax.scan(chunk_step, h0, jax.tree.map(lambda x: jnp.moveaxis(x, 2, 0), ch))
timed("xla lax.scan state pass fwd (fp32)", scan, [(chunks[0],)])
timed("xla lax.scan state pass fwd+vjp (fp32)", lambda ch: jax.vjp(scan, ch)[1](scan(ch)), [(chunks[0],)])
print("\n" + timed.table("phase"))
