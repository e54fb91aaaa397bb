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
from sdm_jax.evaluation.timing import compile_timed, median_ms
from sdm_jax.ops.chunk import chunk_intra, chunk_step

B, T, H = (int(x) for x in sys.argv[1].split(","))
dtype = jnp.dtype(sys.argv[2])
K = V = 128
C = 64
scale = K**-0.5
interpret = jax.default_backend() != "gpu"  # a CPU dry run of this script


def inputs(seed):
  r = np.random.default_rng(seed)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q = unit(r.standard_normal((B, T, H, K), np.float32))
  k = unit(r.standard_normal((B, T, H, K), np.float32))
  v = r.standard_normal((B, T, H, V), np.float32)
  g = -np.logaddexp(0.0, -1.0 - r.standard_normal((B, T, H, K), np.float32))
  b = 1 / (1 + np.exp(-r.standard_normal((B, T, H, K), np.float32)))
  w = 1 / (1 + np.exp(-r.standard_normal((B, T, H, V), np.float32)))
  return [jnp.asarray(x, jnp.float32) for x in (q, k, b * k, w * v, g)]


sets = [inputs(s) for s in range(3)]
io_sets = [[x.astype(dtype) for x in s[:4]] + [s[4]] for s in sets]
rows = []


def timed(name, fn, arg_sets):
  try:
    compiled, compile_s = compile_timed(fn, *arg_sets[0])
    ms = median_ms(compiled, arg_sets, 10)
    rows.append((name, compile_s, ms))
    print(f"{name:<44} compile {compile_s:6.1f} s  {ms:8.3f} ms", flush=True)
    return compiled
  except Exception as error:
    print(f"{name:<44} FAILED {type(error).__name__}: {str(error).splitlines()[0][:200]}", flush=True)


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
print("\n| phase | compile s | ms |\n|---|---|---|")
for name, c, ms in rows:
  print(f"| {name} | {c:.1f} | {ms:.3f} |")
