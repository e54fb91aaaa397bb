"""The Nsight Compute target of `run_h200.sh ncu` and `sdm_ncu`: one op at the H200 bench shape, its forward once,
then its forward and backward once, nothing timed.

    python benchmarks/ncu_target.py sdm [T N V]        # the SDM op: B 4, H 2, W = R = 128, T 4096, N 65,536, V 1,024
    python benchmarks/ncu_target.py gdn2 [chunk_size]  # a dense mixer: B 4, T 4096, H 16, K = V = 128, bf16, chunk 64

It imports jax, numpy, sdm_jax.ops and the benchmarks' input builders alone: two targets that imported
the timed benchmarking modules (`experiments.bench --what=sdm`, and a script over `sdm_jax.benchmarking.sdm_bench`)
died with a segmentation fault as soon as ncu attached; why was not found. A small shape runs on the CPU too
(`sdm 8 512 16`)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.ops import sparse_delta_rule
from sdm_jax.testing.inputs import make_op_inputs, sdm_inputs


def sdm_op(T=4096, N=65536, V=1024):
  floats, ints = sdm_inputs(4, T, 2, N, V, 128, 128, 0)
  # The indices are arguments, not constants: closed over, XLA constant-folded the op's index sorts (46-58 s a
  # compile on the H200).
  return lambda a: sparse_delta_rule(**a[0], **a[1], impl="pallas")[0], (floats, ints)


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
  # Integer arguments (the SDM indices) carry no gradient: only the float ones are differentiated.
  jax.block_until_ready(jax.jit(jax.grad(loss, allow_int=True))(args))
  print(f"ncu target {argv[1]}: done")


if __name__ == "__main__":
  main(sys.argv)
