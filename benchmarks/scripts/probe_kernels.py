"""Probe (2026-11-29/30, sessions 3 to 7): time each Pallas kernel of impl="pallas", forward and backward,
over launch settings, and check the backward against autodiff of the chunk impl.

  CHUNKS=64,32 FWD="32:4:64:4,16:2:64:4" BWD="32:4:32:4" PYTHONPATH=. python3 benchmarks/scripts/probe_kernels.py 4,4096,16

STATE_BLOCKS / STATE_STAGES: block_v and Triton num_stages of the state passes (STATE_STAGES "auto": the
library's rule, `StatePassSettings.for_shape`, the default). FWD: `IntraChunkSettings`
key_block:num_warps:solve_block:solve_warps[:stages[:solve_stages]] (solve_block: its key and value block;
stages: Triton num_stages of gram_solve and solved, default the library's); BWD: `IntraChunkBwdSettings`
key_block:num_warps:pair_key_block:pair_warps[:stages] (stages default: the library's); SUB_BLOCK the sub-block
size of both (default the library's). Fields not given keep the library's defaults.
GDN-2 inputs (K = V = 128), bf16 q, u, e, z and fp32 g. Median of 10 warm runs over 3 rotated input sets
(`timing.median_ms`: device kernel time on the GPU). The op (default settings) is timed forward and
forward+backward and broken down per kernel.
"""
import dataclasses
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.delta_rule_bwd import IntraChunkBwdSettings, StatePassBwdSettings, intra_chunk_bwd, state_pass_bwd
from pallas_kernels.delta_rule_fwd import IntraChunkSettings, StatePassSettings, chunk_cumsum, intra_chunk, state_pass
from pallas_kernels.mixer_inputs import FORMED
from sdm_jax.ops.chunk import delta_rule_chunk
from sdm_jax.ops.pallas import delta_rule_pallas

from probe_common import Timer, breakdown, gdn2_probe

B, T, H, K, dtype, scale, interpret, sets = gdn2_probe(sys.argv[1])
V = K
timed = Timer()
h0 = jnp.zeros((B, H, K, V), jnp.float32)
CHUNKS = [int(x) for x in os.environ.get("CHUNKS", "64").split(",")]
settings = lambda name, default: [tuple(int(n) for n in x.split(":")) for x in os.environ.get(name, default).split(",")]
FWD, BWD = settings("FWD", "32:4:64:4"), settings("BWD", "32:4:32:4")
SUB_BLOCK = {"sub_block": int(os.environ["SUB_BLOCK"])} if "SUB_BLOCK" in os.environ else {}
STATE_BLOCKS = [int(x) for x in os.environ.get("STATE_BLOCKS", "32").split(",")]
STATE_STAGES = [None if x == "auto" else int(x) for x in os.environ.get("STATE_STAGES", "auto").split(",")]
stages_label = lambda st: "auto" if st is None else st
for C in CHUNKS:
  kw = dict(chunk_size=C, interpret=interpret)
  # intra_chunk's arguments: q, the formed (u, z, e) and G (kernels read G, not g)
  chunk_sets = [(q, (u, z, e), chunk_cumsum(g, C, interpret)) for q, u, e, z, g in sets]
  for kb, nw, sb, sw, *stages in FWD:
    fwd = dataclasses.replace(IntraChunkSettings.default(C), key_block=kb, num_warps=nw, solve_key_block=sb,
                              solve_value_block=sb, solve_warps=sw, **SUB_BLOCK,
                              **dict(zip(("num_stages", "solve_stages"), stages)))
    timed(f"C={C} intra_chunk save_inverse key_block={kb} warps={nw} solve_block={sb} solve_warps={sw} "
          f"stages={fwd.num_stages}:{fwd.solve_stages}",
          lambda *a, fwd=fwd: intra_chunk(*a, save_inverse=True, settings=fwd, scale=scale, **kw), chunk_sets)
  chunks = intra_chunk(*chunk_sets[0], save_inverse=True, scale=scale, **kw)
  q, (u, z, e), G = chunk_sets[0]
  for bv in STATE_BLOCKS:
    for st in STATE_STAGES:
      state = StatePassSettings.for_shape(C, B, H, K, V, dtype, block_v=bv, num_stages=st)
      timed(f"C={C} state_pass bv={bv} stages={stages_label(st)}",
            lambda *a, state=state: state_pass(*a, settings=state, **kw), [(chunks, h0)])
      timed(f"C={C} state_pass bv={bv} stages={stages_label(st)} save_states",
            lambda *a, state=state: state_pass(*a, settings=state, save_states=True, **kw), [(chunks, h0)])
  o, ht, states, r = state_pass(chunks, h0, save_states=True, **kw)
  d_o = jnp.asarray(np.random.default_rng(9).standard_normal(o.shape), dtype)
  d_ht = jnp.zeros_like(ht)
  for bv in STATE_BLOCKS:
    for st in STATE_STAGES:
      state = StatePassBwdSettings.for_shape(C, B, H, K, V, dtype, block_v=bv, num_stages=st)
      timed(f"C={C} state_pass_bwd bv={bv} stages={stages_label(st)}",
            lambda *a, state=state: state_pass_bwd(*a, settings=state, **kw), [(chunks, d_o, d_ht)])
  d_r, dh0, d_states = state_pass_bwd(chunks, d_o, d_ht, **kw)
  bwd_args = [(q, u, e, z, G, r, chunks.A, states, d_states, d_o, d_r)]
  for kb, nw, pkb, pw, *stages in BWD:
    bwd = dataclasses.replace(IntraChunkBwdSettings.default(C), key_block=kb, num_warps=nw, pair_key_block=pkb,
                              pair_warps=pw, **SUB_BLOCK, **dict(zip(("num_stages",), stages)))
    timed(f"C={C} intra_chunk_bwd key_block={kb} warps={nw} pair_key_block={pkb} pair_warps={pw} "
          f"stages={stages_label(stages[0] if stages else None)}",
          lambda *a, bwd=bwd: intra_chunk_bwd(*a, settings=bwd, scale=scale, **kw), bwd_args)

# The whole op (generalized rule, already-formed u, e, z, default settings): forward, and forward + backward.
for chunk in CHUNKS:
  op = lambda q, u, e, z, g, chunk=chunk: delta_rule_pallas(FORMED, q, u, z, (e,), g, scale, h0, chunk, dtype)
  fwd = timed(f"pallas op fwd, chunk {chunk}", lambda *a: op(*a)[0], sets)
  loss = lambda *a, op=op: jnp.sum(op(*a)[0].astype(jnp.float32) * d_o.astype(jnp.float32))
  step = timed(f"pallas op fwd+bwd, chunk {chunk}", jax.grad(loss, argnums=(0, 1, 2, 3, 4)), sets)
  if not interpret:
    breakdown(f"op fwd, chunk {chunk}", fwd, sets[0])
    breakdown(f"op fwd+bwd, chunk {chunk}", step, sets[0])

# Gradients against autodiff of the chunk impl (fp32 on the same bf16-rounded inputs).
ref_loss = lambda *a: jnp.sum(delta_rule_chunk(*[x.astype(jnp.float32) for x in a], scale, h0, 64)[0]
                              * d_o.astype(jnp.float32))
try:
  ours = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*sets[0])
  ref = jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2, 3, 4)))(*sets[0])
  for name, a, b in zip("quezg", ours, ref):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    print(f"d{name}: rel err vs chunk autodiff {np.linalg.norm(a - b) / np.linalg.norm(b):.2e}"
          f" finite={np.all(np.isfinite(a))}", flush=True)
except Exception as error:
  print(f"gradient check FAILED {type(error).__name__}: {str(error).splitlines()[0][:300]}", flush=True)

print("\n" + timed.table("kernel"))
