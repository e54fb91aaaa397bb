"""The Nsight Compute target of `run_h200.sh ncu` and `sdm_ncu`: one op at the H200 bench shape, its forward once,
then its forward and backward once, nothing timed.

    python benchmarks/ncu_target.py sdm [T N V]        # the SDM op: B 4, H 2, W = R = 128, T 4096, N 65,536, V 1,024
    python benchmarks/ncu_target.py gdn2 [chunk_size]  # a dense mixer: B 4, T 4096, H 16, K = V = 128, bf16, chunk 64

It imports jax, numpy, sdm_jax.ops and the benchmarks' input builder alone: in session 18 two targets that imported
the timed benchmarking modules (`experiments.bench --what=sdm`, and a script over `sdm_jax.benchmarking.sdm_bench`)
died with a segmentation fault as soon as ncu attached; why was not found. A small shape runs on the CPU too
(`sdm 8 512 16`)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.benchmarking.op_inputs import make_op_inputs
from sdm_jax.ops import sparse_delta_rule


def sdm_op(T=4096, N=65536, V=1024):
  B, H, W = 4, 2, 128
  rng = np.random.default_rng(0)
  weights = lambda: jax.nn.softmax(jnp.asarray(rng.standard_normal((B, T, H, W), np.float32)), axis=-1)
  args = {"m0": jnp.asarray(0.01 * rng.standard_normal((H, N, V), np.float32)), "k_w": weights(), "q_w": weights(),
          "v": jnp.asarray(rng.standard_normal((B, T, H, V), np.float32), jnp.bfloat16),
          "g": jnp.asarray(-np.logaddexp(0.0, -rng.standard_normal((B, T, H)) - 1.0), jnp.float32),
          "beta": jnp.asarray(1 / (1 + np.exp(-rng.standard_normal((B, T, H)))), jnp.float32)}
  ints = {name: jnp.asarray(rng.integers(0, N, (B, T, H, W)), jnp.int32) for name in ("k_idx", "q_idx")}
  return lambda a: sparse_delta_rule(**a, **ints, impl="pallas")[0], args


def dense_op(mixer, chunk_size=64):
  fn, args = make_op_inputs(mixer, 4, 4096, 16, 128, 128, jnp.bfloat16, 0)
  return lambda a: fn(a, impl="pallas", chunk_size=chunk_size)[0], args


def main(argv):
  if len(argv) < 2:
    raise SystemExit(__doc__)
  numbers = [int(x) for x in argv[2:]]
  forward, args = sdm_op(*numbers) if argv[1] == "sdm" else dense_op(argv[1], *numbers)
  readout = jnp.asarray(np.random.default_rng(1).standard_normal(jax.eval_shape(forward, args).shape), jnp.float32)
  loss = lambda a: jnp.sum(forward(a).astype(jnp.float32) * readout)
  jax.block_until_ready(jax.jit(forward)(args))
  jax.block_until_ready(jax.jit(jax.grad(loss))(args))
  print(f"ncu target {argv[1]}: done")


if __name__ == "__main__":
  main(sys.argv)
