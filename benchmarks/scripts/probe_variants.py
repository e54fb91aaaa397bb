"""Probe (2026-11-29, session 4): where the time of each Pallas kernel goes, by timing variants.

  PYTHONPATH=. python3 benchmarks/scripts/probe_variants.py 4,4096,16

Each variant patches one thing for the duration of its timing (launch settings, bf16 operands for the
io dots, the inverse's precision, fewer tree levels) and clears jax's caches so the kernel is traced
again. Variants marked "timing only" compute a wrong result on purpose, to price one stage. The others
print their relative error against the unpatched kernel's outputs. GDN-2 inputs, bf16, K = V = 128, chunk 64.

Its one H200 run (2026-11-29_h200_probe_variants.txt) was at commit 37ce656's kernels, before the
bf16-operand io dots and the Newton-corrected inverse; that run also priced a one-pass TF32 inverse
and a "bf16 io dots" patch, which the kernels now do (so those two variants are gone from the list).
"""
import contextlib
import os
import sys
import warnings

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
warnings.filterwarnings("ignore")

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import chunk_math as cm
from pallas_kernels import delta_rule_bwd, delta_rule_fwd
from pallas_kernels.delta_rule_bwd import intra_chunk_bwd, state_pass_bwd
from pallas_kernels.delta_rule_fwd import intra_chunk, state_pass

from probe_common import Timer, gdn2_inputs

B, T, H = (int(x) for x in sys.argv[1].split(","))
K = V = int(os.environ.get("PROBE_DIM", "128"))
C = 64
dtype = jnp.bfloat16
timed = Timer()
print(f"B={B} T={T} H={H} K=V={K} C={C} bf16; {jax.devices()[0].device_kind}", flush=True)
sets = [gdn2_inputs(B, T, H, K, V, s, dtype) for s in range(3)]
h0 = jnp.zeros((B, H, K, V), jnp.float32)
kw = dict(scale=K**-0.5, chunk_size=C, interpret=jax.default_backend() != "gpu")
original = {"dot": cm.dot, "params": delta_rule_fwd.params, "inverse": cm.unit_lower_inverse,
            "block_sizes": cm.block_sizes}


@contextlib.contextmanager
def patched(stages=None, bf16_dots=False, inverse=None, levels=None):
  saved = []

  def put(module, name, value):
    saved.append((module, name, getattr(module, name)))
    setattr(module, name, value)

  if stages:
    for module in (delta_rule_fwd, delta_rule_bwd):
      put(module, "params", lambda num_warps, num_stages=1: original["params"](num_warps, stages))
  if bf16_dots:  # io-precision dots on bf16 operands (fp32 accumulation)
    def dot(a, b, precision):
      if precision == jax.lax.Precision.DEFAULT:
        return original["dot"](a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), None)
      return original["dot"](a, b, precision)
    put(cm, "dot", dot)
  if inverse == "none":
    put(cm, "unit_lower_inverse", lambda T, dots: T + (cm.iota(T.shape, 0) == cm.iota(T.shape, 1)))
  if levels:
    put(cm, "block_sizes", lambda C: [b for b in original["block_sizes"](C) if b >= levels])
  jax.clear_caches()
  try:
    yield
  finally:
    for module, name, value in reversed(saved):
      setattr(module, name, value)
    jax.clear_caches()


def rel_err(out, ref):
  errs = [np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)) / (np.linalg.norm(np.asarray(b, np.float64)) + 1e-30)
          for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref))]
  return max(errs)


def variant(name, fn, arg_sets, ref=None, **patch):
  with patched(**patch):
    compiled = timed(name, fn, arg_sets)
    if compiled is not None and ref is not None:
      print(f"    max rel err vs unpatched: {rel_err(compiled(*arg_sets[0]), ref):.2e}", flush=True)


# Forward intra-chunk kernel.
intra = lambda kb=32, nw=4: (lambda *a: intra_chunk(*a, save_inverse=True, key_block=kb, num_warps=nw, **kw))
ref_intra = jax.jit(intra())(*sets[0])
variant("intra base (kb 32, 4 warps, 1 stage)", intra(), sets)
variant("intra kb 64", intra(64), sets, ref_intra)
variant("intra kb 16", intra(16), sets, ref_intra)
variant("intra 2 warps", intra(nw=2), sets, ref_intra)
variant("intra 8 warps", intra(nw=8), sets, ref_intra)
variant("intra 2 stages", intra(), sets, ref_intra, stages=2)
variant("intra bf16 io dots", intra(), sets, ref_intra, bf16_dots=True)
variant("intra no inverse (timing only)", intra(), sets, inverse="none")
variant("intra levels >= 16 only (timing only)", intra(), sets, levels=16)
variant("intra bf16 io dots, 2 warps", intra(nw=2), sets, ref_intra, bf16_dots=True)

# State passes.
q, u, e, z, g = sets[0]
y, w, aqk, A = ref_intra
sp = lambda bv=32, nw=4: (lambda *a: state_pass(*a, block_v=bv, save_states=True, num_warps=nw, **kw))
sp_args = [(q, u, g, y, w, aqk, h0)]
ref_sp = jax.jit(sp())(*sp_args[0])
variant("state_pass base (bv 32, saves)", sp(), sp_args)
variant("state_pass bv 16", sp(16), sp_args, ref_sp)
variant("state_pass bv 64", sp(64), sp_args, ref_sp)
variant("state_pass 2 stages", sp(), sp_args, ref_sp, stages=2)
variant("state_pass 3 stages", sp(), sp_args, ref_sp, stages=3)
variant("state_pass bv 16, 2 stages", sp(16), sp_args, ref_sp, stages=2)
o, ht, states, r = ref_sp
d_o = jnp.asarray(np.random.default_rng(9).standard_normal(o.shape), dtype)
spb = lambda bv=32: (lambda *a: state_pass_bwd(*a, block_v=bv, **kw))
spb_args = [(q, u, g, y, aqk, d_o, jnp.zeros_like(ht))]
ref_spb = jax.jit(spb())(*spb_args[0])
variant("state_pass_bwd base (bv 32)", spb(), spb_args)
variant("state_pass_bwd bv 16", spb(16), spb_args, ref_spb)
variant("state_pass_bwd 2 stages", spb(), spb_args, ref_spb, stages=2)
variant("state_pass_bwd bv 16, 2 stages", spb(16), spb_args, ref_spb, stages=2)

# Backward intra-chunk kernel.
d_r, dh0, d_states = ref_spb
ib = lambda kb=32, nw=4: (lambda *a: intra_chunk_bwd(*a, key_block=kb, num_warps=nw, **kw))
ib_args = [(q, u, e, z, g, y, r, A, states, d_states, d_o, d_r)]
ref_ib = jax.jit(ib())(*ib_args[0])
variant("intra_bwd base (kb 32, 4 warps)", ib(), ib_args)
variant("intra_bwd bf16 io dots", ib(), ib_args, ref_ib, bf16_dots=True)
variant("intra_bwd 2 warps", ib(nw=2), ib_args, ref_ib)
variant("intra_bwd 2 stages", ib(), ib_args, ref_ib, stages=2)
variant("intra_bwd kb 64", ib(64), ib_args, ref_ib)
variant("intra_bwd levels >= 16 only (timing only)", ib(), ib_args, levels=16)

print("\n" + timed.table("variant"))
