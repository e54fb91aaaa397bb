"""Probe (2026-11-29, session 6): where intra_chunk's time goes, stage by stage, as separate launches.

  KEY_BLOCK=16 PYTHONPATH=. python3 benchmarks/scripts/probe_stages.py 4,4096,16 [dump_dir]

Each stage of `delta_rule_fwd.intra_chunk` runs alone on the same (B, H, N) grid: a copy kernel that
reads and writes what intra_chunk does (the launch's memory floor), the decayed grams (with and without
the elementwise sub-blocks and the tree levels; the partial ones are timing only), the inverse (full, and
its parts, timing only), the Y/U/decays stage from a given inverse, and inverse with Y/U in one launch
(grams + solve: intra_chunk split in two). Chunk sizes 64 and 32. With a
dump_dir, the compiled intra_chunk's PTX is dumped there and `ptxas -v` (when found) reports registers and
spills. GDN-2 inputs, bf16 io.
"""
import functools
import glob
import os
import shutil
import subprocess
import sys
import warnings

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if len(sys.argv) > 2:
  os.environ["XLA_FLAGS"] = f"--xla_dump_to={sys.argv[2]} " + os.environ.get("XLA_FLAGS", "")
warnings.filterwarnings("ignore")

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from pallas_kernels import chunk_math as cm
from pallas_kernels.delta_rule_fwd import chunk_row_spec, chunk_spec, columns, intra_chunk, params, write_solved
from sdm_jax.ops.pallas import delta_rule_pallas

from probe_common import Timer, gdn2_probe

KEY_BLOCK = int(os.environ.get("KEY_BLOCK", "32"))  # 32 in session 6's call 1
B, T, H, K, dtype, scale, interpret, sets = gdn2_probe(sys.argv[1])
V = K
timed = Timer()


def call(kernel, args, outs, C, warps=4):
  """One (B, H, N) launch: every arg and out a [B, T, H, d] chunk-tiled array ([B, N, H, K] for 'row')."""
  spec = lambda shape: chunk_row_spec(shape[-1]) if shape[1] == T // C else chunk_spec(C, shape[-1])
  return pl.pallas_call(kernel, out_shape=tuple(jax.ShapeDtypeStruct(s, d) for s, d in outs), grid=(B, H, T // C),
                        in_specs=[spec(a.shape) for a in args], out_specs=tuple(spec(s) for s, _ in outs),
                        compiler_params=params(warps), interpret=interpret)(*args)


def copy_kernel(q_ref, u_ref, e_ref, z_ref, g_ref, y_ref, w_ref, aqk_ref, qd_ref, ud_ref, a_ref):
  C = q_ref.shape[0]
  y_ref[...] = e_ref[...]
  w_ref[...] = z_ref[...]
  qd_ref[...] = q_ref[...]
  ud_ref[...] = u_ref[...]
  s = jnp.sum(g_ref[:, pl.ds(0, C)], axis=1, keepdims=True)
  aqk_ref[...] = jnp.broadcast_to(s, (C, C)).astype(aqk_ref.dtype)
  a_ref[...] = jnp.broadcast_to(s, (C, C))


def grams_kernel(q_ref, u_ref, e_ref, g_ref, t_ref, aqk_ref, *, blocks, levels, sub, kb=KEY_BLOCK):
  f32 = jnp.float32
  C = q_ref.shape[0]
  dots = cm.precisions(q_ref.dtype, interpret)
  eye = cm.iota((C, C), 0) == cm.iota((C, C), 1)

  def gram_block(i, acc):
    G = jnp.cumsum(columns(g_ref, i, kb), axis=0)
    q, u, e = columns(q_ref, i, kb) * scale, columns(u_ref, i, kb), columns(e_ref, i, kb)
    grams = cm.block_grams([e, q], u, G, sub) if blocks else [jnp.zeros((C, C), f32)] * 2
    if levels:
      for b in cm.block_sizes(C, sub):
        row_factor, col_factor = cm.level_factors(G, b)
        mask = cm.pair_mask(C, b)
        y_col = (u * col_factor).T
        grams = [m + jnp.where(mask, cm.dot(x * row_factor, y_col, dots.io), 0.0) for m, x in zip(grams, [e, q])]
    return acc[0] + grams[0], acc[1] + grams[1] + jnp.where(eye, jnp.sum(q * u, axis=1, keepdims=True), 0.0)

  zeros = jnp.zeros((C, C), f32)
  Tm, A_qk = jax.lax.fori_loop(0, K // kb, gram_block, (zeros, zeros))
  t_ref[...] = Tm
  aqk_ref[...] = A_qk.astype(aqk_ref.dtype)


def inverse_kernel(t_ref, a_ref, *, levels, newton):
  C = t_ref.shape[0]
  dots = cm.precisions(jnp.bfloat16, interpret)
  Tm = t_ref[...]
  if levels and newton:
    a_ref[...] = cm.unit_lower_inverse(Tm, dots)
    return
  eye = (cm.iota((C, C), 0) == cm.iota((C, C), 1)).astype(jnp.float32)
  A = eye - Tm
  if levels:
    A = eye
    for b in reversed(cm.block_sizes(C)):
      A = A - cm.dot(A, cm.dot(jnp.where(cm.pair_mask(C, b), Tm, 0.0), A, dots.tf32), dots.tf32)
  if newton:
    A = A + cm.dot(A, eye - A - cm.dot(Tm, A, dots.near), dots.near)
  a_ref[...] = A


def apply_kernel(a_ref, *refs):
  apply(a_ref[...], *refs)


def solve_kernel(t_ref, *refs):
  """The inverse and Y/U in one launch: with grams_kernel, intra_chunk split in two."""
  apply(cm.unit_lower_inverse(t_ref[...], cm.precisions(refs[3].dtype, interpret)), *refs)


def apply(A, *refs):
  write_solved(A, *refs, scale=scale, key_block=KEY_BLOCK, io=cm.precisions(refs[3].dtype, interpret).io)


for C in (64, 32):
  key, val = ((B, T, H, K), dtype), ((B, T, H, V), dtype)
  sq = lambda dt: ((B, T, H, C), dt)
  f32 = jnp.float32
  h0 = jnp.zeros((B, H, K, V), f32)
  timed(f"C={C} intra_chunk (as used, saves A)",
        lambda *a, C=C: intra_chunk(*a, save_inverse=True, scale=scale, chunk_size=C, interpret=interpret), sets)
  timed(f"C={C} op fwd", lambda q, u, e, z, g, C=C: delta_rule_pallas(q, u, e, z, g, scale, h0, C, dtype)[0], sets)
  timed(f"C={C} copy (memory floor of the launch)",
        lambda *a, C=C: call(copy_kernel, a, [key, val, sq(dtype), key, key, sq(f32)], C), sets)
  drop_z = [(q, u, e, g) for q, u, e, z, g in sets]
  for name, kw in [("grams (as used)", dict(blocks=True, levels=True, sub=cm.SUB_BLOCK)),
                   ("grams, tree dots only, no sub-blocks (timing only)", dict(blocks=False, levels=True, sub=cm.SUB_BLOCK)),
                   ("grams, sub-blocks only (timing only)", dict(blocks=True, levels=False, sub=cm.SUB_BLOCK)),
                   ("grams, all levels as dots (sub 1)", dict(blocks=False, levels=True, sub=1))]:
    timed(f"C={C} {name}", lambda *a, C=C, kw=kw: call(functools.partial(grams_kernel, **kw), a, [sq(f32), sq(dtype)], C),
          drop_z)
  Ts = [(call(functools.partial(grams_kernel, blocks=True, levels=True, sub=cm.SUB_BLOCK), s, [sq(f32), sq(dtype)], C)[0],)
        for s in drop_z]
  for name, kw in [("inverse (as used)", dict(levels=True, newton=True)),
                   ("inverse, TF32 levels only (timing only)", dict(levels=True, newton=False)),
                   ("inverse, Newton step only (timing only)", dict(levels=False, newton=True))]:
    timed(f"C={C} {name}", lambda *a, C=C, kw=kw: call(functools.partial(inverse_kernel, **kw), a, [sq(f32)], C), Ts)
  As = [(call(functools.partial(inverse_kernel, levels=True, newton=True), t, [sq(f32)], C)[0], *s)
        for t, s in zip(Ts, sets)]
  ys = [key, val, key, key, ((B, T // C, H, K), f32)]
  timed(f"C={C} Y, U and decays from A", lambda *a, C=C: call(apply_kernel, a, ys, C), As)
  timed(f"C={C} inverse + Y, U and decays from T (solve)", lambda *a, C=C: call(solve_kernel, a, ys, C),
        [(t, *s) for (t,), s in zip(Ts, sets)])
  split = call(solve_kernel, (Ts[0][0], *sets[0]), ys, C)
  fused = intra_chunk(*sets[0], scale=scale, chunk_size=C, interpret=interpret)
  for name, a, b in zip(("Y", "U"), split, fused):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    print(f"C={C} split against fused intra_chunk, {name}: rel err {np.linalg.norm(a - b) / np.linalg.norm(b):.1e}")
  for warps in (2, 8):
    timed(f"C={C} grams (as used), {warps} warps",
          lambda *a, C=C, w=warps: call(functools.partial(grams_kernel, blocks=True, levels=True, sub=cm.SUB_BLOCK), a,
                                        [sq(f32), sq(dtype)], C, w), drop_z)

print("\n" + timed.table("stage"), flush=True)

if len(sys.argv) > 2:
  dump = sys.argv[2]
  files = sorted(glob.glob(os.path.join(dump, "*")))
  print(f"\n{len(files)} dump files; ptx: {sum(f.endswith('.ptx') for f in files)}; named triton:",
        [os.path.basename(f) for f in files if "triton" in f.lower()][:10])
  found = [f for d in sys.path if os.path.isdir(d) for f in glob.glob(os.path.join(d, "nvidia", "**", "ptxas"), recursive=True)]
  ptxas = shutil.which("ptxas") or (found[0] if found else None)
  print(f"ptxas: {ptxas}")
  for f in files:
    if f.endswith(".ptx") and ptxas:
      out = subprocess.run([ptxas, "-arch=sm_90a", "-v", f, "-o", "/dev/null"], capture_output=True, text=True)
      lines = [l for l in (out.stdout + out.stderr).splitlines() if "registers" in l or "spill" in l or "Compiling" in l]
      print(os.path.basename(f), *lines[:12], sep="\n  ")
