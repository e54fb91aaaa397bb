"""Probe (2026-11-29, session 6): the SDM chunk impl's forward time against its chunk size, and the
output's relative difference from chunk 16 (the result does not depend on the chunk size).

  PYTHONPATH=. python benchmarks/scripts/probe_sdm_chunks.py            # B 1, T 2048, H 1, N 4096, V 64, W = R = 16
"""
import statistics
import timeit

import jax
import jax.numpy as jnp

from sdm_jax.benchmarking.sdm_bench import sdm_inputs
from sdm_jax.ops import sparse_delta_rule

B, T, H, N, V, W, R = 1, 2048, 1, 4096, 64, 16, 16
floats, ints = sdm_inputs(B, T, H, N, V, W, R, 0)
print(f"B={B} T={T} H={H} N={N} V={V} W=R={W}, {jax.devices()[0].device_kind}; median of 3 warm runs, wall clock", flush=True)
reference = None
for C in (16, 64, 256, 1024):
  forward = jax.jit(lambda fl, it, C=C: sparse_delta_rule(**fl, **it, impl="chunk", chunk_size=C)[0])
  o = jax.block_until_ready(forward(floats, ints)).astype(jnp.float32)
  ms = 1e3 * statistics.median(timeit.repeat(lambda: jax.block_until_ready(forward(floats, ints)), number=1, repeat=3))
  reference = o if reference is None else reference
  print(f"chunk {C:5d}: {ms:8.0f} ms, rel diff vs chunk 16 "
        f"{float(jnp.linalg.norm(o - reference) / jnp.linalg.norm(reference)):.1e}", flush=True)
