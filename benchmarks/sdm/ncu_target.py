"""The Nsight Compute target of `run_h200.sh sdm_ncu`: the SDM op at the paper layer shape (B 4, T 4096, H 2,
N 65,536, V 1,024, W = R = 128; `python benchmarks/sdm/ncu_target.py T N V` for another, e.g. a small one on the CPU), its
forward once and then its forward and backward once. It imports jax, numpy and sdm_jax.ops alone: in session 18 two
targets that imported the benchmarking package (`experiments.bench --what=sdm`, and a script over
`sdm_jax.benchmarking.sdm_bench`) died with a segmentation fault as soon as ncu attached; why was not found."""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.ops import sparse_delta_rule

T, N, V = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 1 else (4096, 65536, 1024)
B, H, W = 4, 2, 128
rng = np.random.default_rng(0)
weights = lambda: jax.nn.softmax(jnp.asarray(rng.standard_normal((B, T, H, W), np.float32)), axis=-1)
floats = {"m0": jnp.asarray(0.01 * rng.standard_normal((H, N, V), np.float32)), "k_w": weights(), "q_w": weights(),
          "v": jnp.asarray(rng.standard_normal((B, T, H, V), np.float32), jnp.bfloat16),
          "g": jnp.asarray(-np.logaddexp(0.0, -rng.standard_normal((B, T, H)) - 1.0), jnp.float32),
          "beta": jnp.asarray(1 / (1 + np.exp(-rng.standard_normal((B, T, H)))), jnp.float32)}
ints = {name: jnp.asarray(rng.integers(0, N, (B, T, H, W)), jnp.int32) for name in ("k_idx", "q_idx")}
r_o = jnp.asarray(rng.standard_normal((B, T, H, V)), jnp.float32)


def loss(floats):
  o = sparse_delta_rule(**floats, **ints, impl="pallas")[0]
  return jnp.sum(o.astype(jnp.float32) * r_o)


jax.block_until_ready(jax.jit(lambda f: sparse_delta_rule(**f, **ints, impl="pallas")[0])(floats))
jax.block_until_ready(jax.jit(jax.grad(loss))(floats))
print("ncu target: done")
