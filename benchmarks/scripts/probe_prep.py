"""Probe (2026-11-30, session 9): the memory-bound launches in front of the chunk kernels, alone, over launch
settings: `mixer_inputs` (l2norm, a mixer's build, the io cast) for GDN-2 and KDA against XLA's
`reference_inputs`, and `chunk_cumsum` against XLA's cumsum. Each line gives the byte floor at 4.8 TB/s.

  PREP_ROWS=16,32,64,128 PREP_WARPS=2,4,8 CHUNKS=32,64 PYTHONPATH=. python3 benchmarks/scripts/probe_prep.py 4,4096,16

K = V = 128, bf16 inputs, fp32 g. Median of 10 warm runs over 3 rotated input sets (`timing.median_ms`).
"""
import dataclasses
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.delta_rule_fwd import ChunkCumsumSettings, chunk_cumsum
from pallas_kernels.mixer_inputs import MixerInputsSettings, mixer_inputs, reference_inputs
from sdm_jax.ops import MIXERS
from sdm_jax.ops.registry import gate_shapes

from probe_common import Timer

B, T, H = (int(x) for x in sys.argv[1].split(","))
K = V = 128
interpret = jax.default_backend() != "gpu"
print(f"B={B} T={T} H={H} K=V={K} bf16; {jax.devices()[0].device_kind}", flush=True)
ints = lambda name, default: [int(x) for x in os.environ.get(name, default).split(",")]
ROWS, WARPS, CHUNKS = ints("PREP_ROWS", "16,32,64,128"), ints("PREP_WARPS", "2,4,8"), ints("CHUNKS", "32,64")
timed = Timer()
floor = lambda arrays: f"(floor {sum(x.size * x.dtype.itemsize for x in arrays) / 4.8e9:.3f} ms)"


def inputs(mixer, seed):
  """(build, q, k, v, gates after g) of the mixer, bf16."""
  r = np.random.default_rng(seed)
  x = lambda *s: jnp.asarray(r.standard_normal(s, np.float32), jnp.bfloat16)
  gate = lambda *s: jnp.asarray(r.uniform(size=s).astype(np.float32), jnp.bfloat16)
  shape = gate_shapes(B, T, H, K, V)
  gates = [gate(*shape[kind]) for _, kind in MIXERS[mixer].gates]
  return MIXERS[mixer].build, [x(B, T, H, K), x(B, T, H, K), x(B, T, H, V), *gates]


for mixer in ("gdn2", "kda"):
  sets = [inputs(mixer, s) for s in range(3)]
  build, arrays = sets[0]
  out = reference_inputs(build, True, jnp.bfloat16, *arrays)
  moved = floor(arrays + list(out))
  args = [a for _, a in sets]
  timed(f"{mixer} XLA reference_inputs {moved}", lambda *a: reference_inputs(build, True, jnp.bfloat16, *a), args)
  for rows in ROWS:
    for warps in WARPS:
      prep = dataclasses.replace(MixerInputsSettings.default(), rows=rows, num_warps=warps)
      timed(f"{mixer} mixer_inputs rows={rows} warps={warps}",
            lambda *a, prep=prep: mixer_inputs(build, True, jnp.bfloat16, *a, settings=prep, interpret=interpret), args)

r = np.random.default_rng(5)
g_sets = [(jnp.asarray(-r.uniform(0, 1, (B, T, H, K)).astype(np.float32)),) for _ in range(3)]
for C in CHUNKS:
  xla = lambda g, C=C: jnp.cumsum(g.reshape(B, T // C, C, H, K), axis=2).reshape(B, T, H, K)
  timed(f"C={C} XLA cumsum {floor([g_sets[0][0]] * 2)}", xla, g_sets)
  for warps in WARPS:
    cumsum = dataclasses.replace(ChunkCumsumSettings.default(), num_warps=warps)
    timed(f"C={C} chunk_cumsum warps={warps}",
          lambda g, C=C, cumsum=cumsum: chunk_cumsum(g, C, interpret, settings=cumsum), g_sets)
print(timed.table("prep launch"), flush=True)
