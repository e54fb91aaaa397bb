"""Probe (2026-11-30, session 11): the SDM pallas op kernel by kernel (CUPTI), and its token-by-token kernels
alone over launch settings, against the byte floor of the rows they move.

  SDM_FWD=16:4:1,8:2:1 SDM_BWD=16:4:1 PYTHONPATH=. python3 benchmarks/scripts/probe_sdm_kernels.py 4,4096

argv: B,T (default the issue's 4,4096); SDM_SHAPE: H,N,V,W (default 2,65536,1024,128; R = W). SDM_FWD, SDM_BWD:
block_v:num_warps:num_stages of `sparse_tokens_fwd` (timed without saving rows, the forward without gradients)
and `sparse_tokens_bwd` (timed on one input set: the rows it reads are B T H W V fp32, 17 GB at the issue's
shape). Each kernel's table argument is aliased to its output, so each timed run also holds XLA's copy of the
[B, H, N, V] fp32 table (its own line below; the backward copies two). Median of 10 warm runs over 3 rotated
input sets.
"""
import os
import sys

import jax
import jax.numpy as jnp

from pallas_kernels.sparse_tokens import sparse_tokens_bwd, sparse_tokens_fwd
from sdm_jax.benchmarking.sdm_bench import sdm_inputs
from sdm_jax.benchmarking.timing import timer_name
from sdm_jax.ops import sparse_delta_rule
from sdm_jax.ops.sparse_pallas import _backward_args, _forward, _forward_args

from probe_common import Timer, breakdown

B, T = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "4,4096").split(","))
H, N, V, W = (int(x) for x in os.environ.get("SDM_SHAPE", "2,65536,1024,128").split(","))
settings = lambda name, default: [tuple(int(x) for x in s.split(":")) for s in os.environ.get(name, default).split(",") if s]
FWD = settings("SDM_FWD", "16:4:1,32:4:1,8:2:1,16:2:1")
BWD = settings("SDM_BWD", "16:4:1,32:4:1")
interpret = jax.default_backend() != "gpu"
timed = Timer()
sets = [sdm_inputs(B, T, H, N, V, W, W, seed) for seed in range(3)]
row_bytes = B * T * H * 3 * W * V * 4  # per token and head: W rows read and rewritten, W (= R) rows read
print(f"B={B} T={T} H={H} N={N} V={V} W=R={W}; {jax.devices()[0].device_kind}; timer: {timer_name()}; forward rows "
      f"{row_bytes / 1e9:.1f} GB, {row_bytes / 4.8e9:.2f} ms at 4.8 TB/s", flush=True)

forward = jax.jit(lambda fl, it: sparse_delta_rule(**fl, **it, impl="pallas")[0])
step = jax.jit(jax.grad(lambda fl, it: jnp.sum(sparse_delta_rule(**fl, **it, impl="pallas")[0].astype(jnp.float32))))
timed("op fwd", forward, sets)
timed("op fwd+bwd", step, sets)
if not interpret:
  breakdown("op fwd", forward, sets[0])
  breakdown("op fwd+bwd", step, sets[0])


def table(fl):
  return jnp.broadcast_to(fl["m0"], (B, H, N, V))


def fwd_args(fl, it):
  return (table(fl), *_forward_args(it["k_idx"], fl["k_w"], fl["v"], fl["g"], fl["beta"], it["q_idx"], fl["q_w"]))


def bwd_args(fl, it):  # the backward kernel's arguments, o and the final table standing in for their cotangents
  v = fl["v"].astype(jnp.float32)
  (o, final), res = _forward(table(fl), it["k_idx"], fl["k_w"], v, fl["g"], fl["beta"], it["q_idx"], fl["q_w"], True)
  return _backward_args(res, o, final)


arg_sets = [jax.block_until_ready(jax.jit(fwd_args)(*s)) for s in sets]
timed("XLA copy of the table (in every kernel line)", lambda table, *a: table + 0.0, arg_sets)
for bv, warps, stages in FWD:
  timed(f"sparse_tokens_fwd block_v={bv} warps={warps} stages={stages}",
        lambda *a, bv=bv, warps=warps, stages=stages: sparse_tokens_fwd(
            *a, save_rows=False, block_v=bv, num_warps=warps, num_stages=stages, interpret=interpret)[1], arg_sets)
del arg_sets
if BWD:
  bwd_set = jax.block_until_ready(jax.jit(bwd_args)(*sets[0]))
  for bv, warps, stages in BWD:
    timed(f"sparse_tokens_bwd block_v={bv} warps={warps} stages={stages}",
          lambda *a, bv=bv, warps=warps, stages=stages: sparse_tokens_bwd(
              *a, block_v=bv, num_warps=warps, num_stages=stages, interpret=interpret)[2], [bwd_set])
  del bwd_set

print()
print(timed.table("SDM"), flush=True)
