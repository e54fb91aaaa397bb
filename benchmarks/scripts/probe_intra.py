"""Probe (2026-11-29, session 3): where the Pallas intra-chunk forward spends its time.

  PYTHONPATH=. python3 benchmarks/scripts/probe_intra.py 4,4096,16

Variants of `pallas_kernels.delta_rule_fwd._diagonal_blocks` (the exact pairwise decay of the
16x16 diagonal blocks), swapped in by monkeypatching; GDN-2 inputs, bf16, K = V = 128, chunk 64.
"""
import os
import sys
import warnings

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
warnings.filterwarnings("ignore")

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

import pallas_kernels.delta_rule_fwd as fwd
from sdm_jax.evaluation.timing import compile_timed, median_ms

B, T, H = (int(x) for x in sys.argv[1].split(","))
K = V = 128
C = 64
scale = K**-0.5
interpret = jax.default_backend() != "gpu"
SUB = fwd.SUB


def zero_diag(q_ref, u_ref, e_ref, g_ref, i, scale):
  z = jnp.zeros((SUB, SUB), jnp.float32)
  return z, z


def column_diag(q_ref, u_ref, e_ref, g_ref, i, scale):
  f32 = jnp.float32
  tile = lambda ref: ref[pl.ds(i * SUB, SUB), :].astype(f32)
  local = jnp.cumsum(tile(g_ref), axis=0)
  e, q, u = tile(e_ref), tile(q_ref) * scale, tile(u_ref)
  row = fwd._iota((SUB, K), 0)
  col = fwd._iota((SUB, SUB), 1)
  t_acc = jnp.zeros((SUB, SUB), f32)
  a_acc = jnp.zeros((SUB, SUB), f32)
  for c in range(SUB):
    pick = row == c
    u_c = jnp.sum(jnp.where(pick, u, 0.0), axis=0, keepdims=True)
    l_c = jnp.sum(jnp.where(pick, local, 0.0), axis=0, keepdims=True)
    dec = jnp.where(row >= c, jnp.exp(jnp.where(row >= c, local - l_c, 0.0)), 0.0) * u_c
    t_c = jnp.sum(jnp.where(row > c, e * dec, 0.0), axis=1, keepdims=True)
    a_c = jnp.sum(q * dec, axis=1, keepdims=True)
    t_acc += jnp.where(col == c, t_c, 0.0)
    a_acc += jnp.where(col == c, a_c, 0.0)
  return t_acc, a_acc


def column_diag_loaded(q_ref, u_ref, e_ref, g_ref, i, scale):
  """Like column_diag, but row c of u and of the local cumsum come from ref loads."""
  f32 = jnp.float32
  tile = lambda ref: ref[pl.ds(i * SUB, SUB), :].astype(f32)
  local = jnp.cumsum(tile(g_ref), axis=0)
  e, q, u = tile(e_ref), tile(q_ref) * scale, tile(u_ref)
  row = fwd._iota((SUB, K), 0)
  col = fwd._iota((SUB, SUB), 1)

  def body(c, acc):
    t_acc, a_acc = acc
    u_c = u_ref[pl.ds(i * SUB + c, 1), :].astype(f32)
    l_c = jnp.sum(jnp.where(row <= c, tile(g_ref), 0.0), axis=0, keepdims=True)
    dec = jnp.where(row >= c, jnp.exp(jnp.where(row >= c, local - l_c, 0.0)), 0.0) * u_c
    t_c = jnp.sum(jnp.where(row > c, e * dec, 0.0), axis=1, keepdims=True)
    a_c = jnp.sum(q * dec, axis=1, keepdims=True)
    return t_acc + jnp.where(col == c, t_c, 0.0), a_acc + jnp.where(col == c, a_c, 0.0)

  z = jnp.zeros((SUB, SUB), f32)
  return jax.lax.fori_loop(0, SUB, body, (z, z))


def inputs(seed, dtype):
  r = np.random.default_rng(seed)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q = unit(r.standard_normal((B, T, H, K), np.float32))
  k = unit(r.standard_normal((B, T, H, K), np.float32))
  v = r.standard_normal((B, T, H, V), np.float32)
  g = -np.logaddexp(0.0, -1.0 - r.standard_normal((B, T, H, K), np.float32))
  b = 1 / (1 + np.exp(-r.standard_normal((B, T, H, K), np.float32)))
  w = 1 / (1 + np.exp(-r.standard_normal((B, T, H, V), np.float32)))
  xs = [jnp.asarray(x, dtype) for x in (q, k, b * k, w * v)]
  return xs + [jnp.asarray(g, jnp.float32)]


print(f"B={B} T={T} H={H} K=V={K} C={C}; {jax.devices()[0].device_kind}", flush=True)
original = fwd._diagonal_blocks
original_params = fwd._params
rows = []
ref = None
for dtype in (jnp.bfloat16,):
  sets = [inputs(s, dtype) for s in range(3)]
  for name, diag, warps in (("3-D tiles (current)", original, 4), ("column loop unrolled", column_diag, 4),
                            ("column loop fori + loads", column_diag_loaded, 4),
                            ("column loop fori + loads, 2 warps", column_diag_loaded, 2),
                            ("column loop fori + loads, 8 warps", column_diag_loaded, 8),
                            ("no diagonal", zero_diag, 4), ("no diagonal, 2 warps", zero_diag, 2)):
    fwd._diagonal_blocks = diag
    fwd._params = lambda num_warps, num_stages, w=warps: original_params(w, num_stages)
    jax.clear_caches()
    try:
      fn = lambda *a: fwd.intra_chunk(*a, scale=scale, chunk_size=C, interpret=interpret)
      compiled, cs = compile_timed(fn, *sets[0])
      ms = median_ms(compiled, sets, 10)
      out = compiled(*sets[0])
      if ref is None:
        ref = out
      err = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))) for a, b in zip(out, ref))
      rows.append((name, cs, ms, err))
      print(f"{name:<30} compile {cs:5.1f} s {ms:8.3f} ms  max|diff vs current| {err:.2e}", flush=True)
    except Exception as error:
      print(f"{name:<30} FAILED {type(error).__name__}: {str(error).splitlines()[0][:300]}", flush=True)
fwd._diagonal_blocks = original
fwd._params = original_params
print("\n| diagonal variant | compile s | ms | max abs diff |\n|---|---|---|---|")
for name, cs, ms, err in rows:
  print(f"| {name} | {cs:.1f} | {ms:.3f} | {err:.1e} |")
