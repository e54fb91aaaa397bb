"""Probe (2026-11-29, session 2): SDM chunk op forward+backward time against the table size N, the
current sparse_chunk.py against an older copy of it, with the largest relative gradient difference.

  git show 1f4dc1a:sdm_jax/ops/sparse_chunk.py > /tmp/old_sparse_chunk.py
  PYTHONPATH=. python benchmarks/scripts/probe_sdm_scaling.py /tmp/old_sparse_chunk.py
"""
import sys, time, importlib.util
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, ".")
from sdm_jax.ops import sparse_chunk as new
spec = importlib.util.spec_from_file_location("old_sparse_chunk", sys.argv[1])
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
from sdm_jax.benchmarking.timing import median_ms
B, T, H, V, W, C = 1, 256, 2, 64, 16, 16
print(f"B={B} T={T} H={H} V={V} W=R={W} chunk={C}, {jax.devices()[0].device_kind}")
for N in (4096, 65536, 262144):
  r = np.random.default_rng(0)
  sm = lambda s: np.exp(s) / np.exp(s).sum(-1, keepdims=True)
  table = jnp.asarray(0.01 * r.standard_normal((B, H, N, V)), jnp.float32)
  k_idx = jnp.asarray(r.integers(0, N, (B, T, H, W)), jnp.int32); q_idx = jnp.asarray(r.integers(0, N, (B, T, H, W)), jnp.int32)
  k_w = jnp.asarray(sm(r.standard_normal((B, T, H, W))), jnp.float32); q_w = jnp.asarray(sm(r.standard_normal((B, T, H, W))), jnp.float32)
  v = jnp.asarray(r.standard_normal((B, T, H, V)), jnp.float32)
  g = jnp.asarray(-np.logaddexp(0, -r.standard_normal((B, T, H)) - 1), jnp.float32)
  beta = jnp.asarray(1 / (1 + np.exp(-r.standard_normal((B, T, H)))), jnp.float32)
  r_o = jnp.asarray(r.standard_normal((B, T, H, V)), jnp.float32)
  row = [f"N={N:>7}"]
  grads = {}
  for name, mod in (("old", old), ("new", new)):
    loss = lambda tb, kw, vv, gg, bb, qw, r_o: jnp.sum(mod.sparse_delta_chunk(tb, k_idx, kw, vv, gg, bb, q_idx, qw, C)[0] * r_o)
    f = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4, 5)))
    args = (table, k_w, v, g, beta, q_w, r_o)
    grads[name] = f(*args)
    row.append(f"{name} fwd+bwd {median_ms(f, [args], 5):8.1f} ms")
  err = max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(a)) + 1e-30)) for a, b in zip(grads["old"], grads["new"]))
  print("  ".join(row), f"  max rel diff of grads {err:.1e}", flush=True)
