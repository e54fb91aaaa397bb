"""Probe (2026-11-30, session 10): the SDM pallas op kernel by kernel (CUPTI), and its forward kernel alone over
launch settings, against the byte floor of the rows it moves.

  SDM_CHUNKS=16 SDM_FWD=64:4:1,32:4:1:4,16:2:1:8 SDM_BWD=64:4:1,16:4:1 PYTHONPATH=. \
    python3 benchmarks/scripts/probe_sdm_kernels.py 4,4096

argv: B,T (default the issue's 4,4096); SDM_SHAPE: H,N,V,W (default 2,65536,1024,128; R = W). SDM_FWD:
block_v:num_warps:num_stages[:unroll] of `sparse_delta_fwd`; SDM_BWD: block_v:num_warps:num_stages
of `sparse_delta_bwd` (timed on one input set: its saved rows alone are B T H W V fp32, 17 GB at the issue's shape). The kernel alone is timed without saving rows (the
forward without gradients); its table argument is aliased to its output, so each timed run also holds XLA's
copy of the [B, H, N, V] fp32 table (its own line below). Median of 10 warm runs over 3 rotated input sets.
"""
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax
import jax.numpy as jnp

from pallas_kernels.sparse_delta import sparse_delta_fwd
from sdm_jax.evaluation.sdm_bench import sdm_inputs
from sdm_jax.evaluation.timing import timer_name
from sdm_jax.ops import sparse_delta_rule
from pallas_kernels.sparse_delta_bwd import sparse_delta_bwd
from pallas_kernels.sparse_tokens import sparse_tokens_bwd, sparse_tokens_fwd
from sdm_jax.ops.sparse_chunk import _to_chunks
from sdm_jax.ops.sparse_pallas import _forward, _heads_first, kernel_inputs

from probe_common import Timer, breakdown

B, T = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "4,4096").split(","))
H, N, V, W = (int(x) for x in os.environ.get("SDM_SHAPE", "2,65536,1024,128").split(","))
CHUNKS = [int(x) for x in os.environ.get("SDM_CHUNKS", "16").split(",")]
settings = lambda name, default: [tuple(int(x) for x in s.split(":")) for s in os.environ.get(name, default).split(",") if s]
FWD = settings("SDM_FWD", "64:4:1,32:4:1,16:4:1")
BWD = settings("SDM_BWD", "64:4:1,32:4:1,16:4:1")
TOKENS_FWD = settings("SDM_TOKENS_FWD", "16:4:1,32:4:1,16:2:1,8:2:1")
TOKENS_BWD = settings("SDM_TOKENS_BWD", "16:4:1,32:4:1")
interpret = jax.default_backend() != "gpu"
timed = Timer()
sets = [sdm_inputs(B, T, H, N, V, W, W, seed) for seed in range(3)]
row_bytes = B * T * H * 3 * W * V * 4  # per token and head: W rows read and rewritten, W (= R) rows read
print(f"B={B} T={T} H={H} N={N} V={V} W=R={W}; {jax.devices()[0].device_kind}; timer: {timer_name()}; rows moved "
      f"{row_bytes / 1e9:.1f} GB, {row_bytes / 4.8e9:.2f} ms at 4.8 TB/s", flush=True)

for C in CHUNKS:
  forward = jax.jit(lambda fl, it, C=C: sparse_delta_rule(**fl, **it, impl="pallas", chunk_size=C)[0])
  loss = lambda fl, it, C=C: jnp.sum(sparse_delta_rule(**fl, **it, impl="pallas", chunk_size=C)[0].astype(jnp.float32))
  step = jax.jit(jax.grad(loss))
  timed(f"C={C} op fwd", forward, sets)
  timed(f"C={C} op fwd+bwd", step, sets)
  if not interpret:
    breakdown(f"C={C} op fwd", forward, sets[0])
    breakdown(f"C={C} op fwd+bwd", step, sets[0])

  def kernel_args(fl, it, C=C):
    table = jnp.broadcast_to(fl["m0"], (B, H, N, V))
    args = kernel_inputs(it["k_idx"], fl["k_w"], fl["v"].astype(jnp.float32), fl["g"], fl["beta"],
                         it["q_idx"], fl["q_w"], C)[0]
    return (table, *args)

  arg_sets = [jax.block_until_ready(jax.jit(kernel_args)(*s)) for s in sets]
  timed(f"C={C} XLA copy of the table (in every kernel line)", lambda table, *a: table + 0.0, arg_sets)
  for bv, warps, stages, *unroll in FWD:
    unroll = unroll[0] if unroll else 1
    timed(f"C={C} sparse_delta_fwd block_v={bv} warps={warps} stages={stages} unroll={unroll}",
          lambda *a, bv=bv, warps=warps, stages=stages, unroll=unroll: sparse_delta_fwd(
              *a, save_rows=False, block_v=bv, num_warps=warps, num_stages=stages, unroll=unroll,
              interpret=interpret)[1], arg_sets)
  del arg_sets

  def bwd_args(fl, it, C=C):  # the backward kernel's arguments, o standing in for its cotangent
    table = jnp.broadcast_to(fl["m0"], (B, H, N, V))
    (o, final), residuals = _forward(table, it["k_idx"], fl["k_w"], fl["v"].astype(jnp.float32), fl["g"], fl["beta"],
                                     it["q_idx"], fl["q_w"], C, save=True)
    return (final, final, *residuals[1], _heads_first(_to_chunks(o, C)))

  if BWD:
    bwd_set = [jax.block_until_ready(jax.jit(bwd_args)(*sets[0]))]
    for bv, warps, stages in BWD:
      timed(f"C={C} sparse_delta_bwd block_v={bv} warps={warps} stages={stages}",
            lambda *a, bv=bv, warps=warps, stages=stages: sparse_delta_bwd(
                *a, block_v=bv, num_warps=warps, num_stages=stages, interpret=interpret)[2], [bwd_set[0]])
    del bwd_set


# The token-by-token kernels (pallas_kernels/sparse_tokens.py): no chunk algebra, each token's rows only.
heads = lambda x: jnp.moveaxis(x, 2, 1)  # [B, T, H, ...] -> [B, H, T, ...]
summed = lambda idx, w: jnp.einsum("...ij,...j->...i", (idx[..., :, None] == idx[..., None, :]).astype(w.dtype), w)
first = lambda idx: (~jnp.any((idx[..., :, None] == idx[..., None, :]) & jnp.tril(jnp.ones((W, W), bool), -1),
                              axis=-1)).astype(jnp.float32)


def tokens_args(fl, it):
  table = jnp.broadcast_to(fl["m0"], (B, H, N, V))
  return (table, *(heads(x) for x in (it["k_idx"], fl["k_w"], summed(it["k_idx"], fl["k_w"]), jnp.exp(fl["g"]),
                                      fl["beta"], fl["v"], it["q_idx"], fl["q_w"])))


if TOKENS_FWD or TOKENS_BWD:
  arg_sets = [jax.block_until_ready(jax.jit(tokens_args)(*s)) for s in sets]
  for bv, warps, stages in TOKENS_FWD:
    timed(f"sparse_tokens_fwd block_v={bv} warps={warps} stages={stages}",
          lambda *a, bv=bv, warps=warps, stages=stages: sparse_tokens_fwd(
              *a, save_rows=False, block_v=bv, num_warps=warps, num_stages=stages, interpret=interpret)[1], arg_sets)
  if TOKENS_BWD:
    bv0 = TOKENS_FWD[0][0] if TOKENS_FWD else 16
    timed(f"sparse_tokens_fwd saving rows block_v={bv0}",
          lambda *a: sparse_tokens_fwd(*a, block_v=bv0, interpret=interpret)[2], arg_sets[:1])
    fl, it = sets[0]
    table, k_idx, k_w, k_slot, decay, beta, v, q_idx, q_w = arg_sets[0]
    final, o, rows = jax.block_until_ready(sparse_tokens_fwd(*arg_sets[0], block_v=bv0, interpret=interpret))
    del arg_sets
    bwd_set = (final, final, k_idx, k_w, k_slot, heads(first(it["k_idx"])), decay, beta, v, q_idx,
               heads(summed(it["q_idx"], fl["q_w"])), rows, o)
    del final, rows
    for bv, warps, stages in TOKENS_BWD:
      timed(f"sparse_tokens_bwd block_v={bv} warps={warps} stages={stages}",
            lambda *a, bv=bv, warps=warps, stages=stages: sparse_tokens_bwd(
                *a, block_v=bv, num_warps=warps, num_stages=stages, interpret=interpret)[2], [bwd_set])
    del bwd_set

print()
print(timed.table("SDM"), flush=True)
