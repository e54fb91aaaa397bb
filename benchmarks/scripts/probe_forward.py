"""Probe (2026-11-30, session 12): where the forward's time goes, first for the KDA forward at 2x8192.

  FORWARD_PARTS=state,ablate,backward STATE_BLOCKS=16,32,64 STATE_WARPS=2,4,8 \
    PYTHONPATH=. python3 benchmarks/scripts/probe_forward.py 2,8192,16 4,4096,16

Parts (FORWARD_PARTS, default state,backward), per shape:
- state: state_pass alone (no saves) over block_v x num_warps (stages: the library's rule), at chunk 32, and at
  chunk 64 for reference (its chain of chunks is half as long).
- ablate: intra_chunk (gram_solve + solved) at chunk 32 with parts of gram_solve taken out by patching chunk_math
  before tracing (the results are wrong; only the time is of interest): the Newton step of the inverse, the whole
  inverse, the elementwise sub-block pairs, the tree's level dots.
- (session 12's call 3 also had a part "pairs": solved merging two chunks into one of 64 for a state pass with
  half as many steps; it lost at every shape, see the record, and was taken out with the code it timed.)
- backward: the training path's state passes (state_pass saving states, state_pass_bwd) over block_v, chunk 32.

GDN-2 inputs already formed (q, u, e, z bf16, g fp32), K = V = 128. Median of 10 warm runs over 3 rotated input
sets (`timing.median_ms`, device time on the GPU).
"""
import dataclasses
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import jax
import jax.numpy as jnp

from pallas_kernels import chunk_math as cm
from pallas_kernels.delta_rule_bwd import StatePassBwdSettings, state_pass_bwd
from pallas_kernels.delta_rule_fwd import StatePassSettings, chunk_cumsum, intra_chunk, state_pass

from probe_common import Timer, gdn2_probe

ints = lambda name, default: [int(x) for x in os.environ.get(name, default).split(",")]
BLOCKS, WARPS = ints("STATE_BLOCKS", "16,32,64"), ints("STATE_WARPS", "2,4,8")
PARTS = os.environ.get("FORWARD_PARTS", "state,backward").split(",")
timed = Timer()
for shape in sys.argv[1:]:
  B, T, H, K, dtype, scale, interpret, sets = gdn2_probe(shape)
  h0 = jnp.zeros((B, H, K, K), jnp.float32)
  for C in (32, 64) if "state" in PARTS else ():
    kw = dict(chunk_size=C, interpret=interpret)
    passes = []
    for q, u, e, z, g in sets:
      passes.append((intra_chunk(q, (u, z, e), chunk_cumsum(g, C, interpret), scale=scale, **kw), h0))
    for bv in BLOCKS:
      for warps in WARPS:
        state = dataclasses.replace(StatePassSettings.for_shape(C, B, H, K, K, dtype, block_v=bv), num_warps=warps)
        timed(f"{shape} C={C} state_pass bv={bv} warps={warps}",
              lambda *a, state=state: state_pass(*a, settings=state, **kw), passes)
    del passes

  kw = dict(chunk_size=32, interpret=interpret)
  chunk_sets = [(q, (u, z, e), chunk_cumsum(g, 32, interpret)) for q, u, e, z, g in sets]
  original = {name: getattr(cm, name) for name in ("unit_lower_inverse", "block_pairs", "level_pairs")}

  ablations = {
      "full": {},
      "inverse without its Newton step": {"unit_lower_inverse": cm.level_inverse},
      "no inverse (A = T)": {"unit_lower_inverse": lambda T_, dots: T_},
      "no sub-block pairs": {"block_pairs": lambda xs, G, sub, rows: [jnp.zeros((G.shape[0], sub), jnp.float32)
                                                                      for _ in xs]},
      "no level dots": {"level_pairs": lambda xs, y, G, precision, sub, rows: [jnp.zeros((G.shape[0],) * 2,
                                                                                         jnp.float32) for _ in xs]},
  }
  for label, patch in ablations.items() if "ablate" in PARTS else ():
    for name, fn in {**original, **patch}.items():
      setattr(cm, name, fn)
    jax.clear_caches()
    timed(f"{shape} C=32 intra_chunk, {label}", lambda *a: intra_chunk(*a, scale=scale, **kw), chunk_sets)
  for name, fn in original.items():
    setattr(cm, name, fn)
  jax.clear_caches()

  if "backward" in PARTS:
    chunks = intra_chunk(*chunk_sets[0], scale=scale, **kw)
    d_o = chunks.U
    for bv in BLOCKS:
      state = StatePassSettings.for_shape(32, B, H, K, K, dtype, block_v=bv)
      timed(f"{shape} C=32 state_pass save_states bv={bv}",
            lambda *a, state=state: state_pass(*a, settings=state, save_states=True, **kw), [(chunks, h0)])
      state = StatePassBwdSettings.for_shape(32, B, H, K, K, dtype, block_v=bv)
      timed(f"{shape} C=32 state_pass_bwd bv={bv}", lambda *a, state=state: state_pass_bwd(*a, settings=state, **kw),
            [(chunks, d_o, h0)])
  del sets, chunk_sets

print("\n" + timed.table("forward kernel"))
