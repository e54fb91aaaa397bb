"""Registers and spills of the SDM token kernels for an H200 (sm_90), without a GPU: how the launch defaults of
`pallas_kernels.sparse_tokens` were chosen (benchmarks/sdm/README.md, launch settings). Two steps, two interpreters:

    .venv/bin/python benchmarks/kernel_registers.py dump DIR ["{'bwd': {'block_v': 64, 'num_warps': 8}}"]
    .venv/bin/python benchmarks/kernel_registers.py dump DIR "{'table': 'bfloat16', 'd_table': 'bfloat16'}"
    <python with triton>  benchmarks/kernel_registers.py compile DIR/bwd.ttir WARPS

`dump` lowers the kernels (forward without and with saved rows, backward, packed backward) for an abstract H200 at
the paper layer's shape but T = 64 (the table, its rows and dM in fp32 unless 'table' / 'd_table' say bfloat16) and
writes each one's Triton IR (text) to DIR; `compile` compiles one with a
Triton install (3.6 here, a CPU-only torch environment's: jaxlib's own Triton is newer, so its register counts
differ by a few: 166 here against Nsight Compute's 176 for one kernel) and prints cuobjdump's resource usage
(REG: registers a thread, STACK: spilled bytes). A program of WARPS warps at REG registers fits
65,536 // (REG x 32 x WARPS) times on a multiprocessor."""

import ast
import os
import subprocess
import sys


def dump(out, settings="{}"):
  import jax
  import jax.numpy as jnp

  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
  from pallas_kernels import sparse_tokens as st
  from sdm_jax.testing.lowering import lower_for_h200, triton_ir

  settings = ast.literal_eval(settings)
  B, H, N, V, T, W, R = 4, 2, 65536, 1024, 64, 128, 128
  S, f32, i32, bf16 = jax.ShapeDtypeStruct, jnp.float32, jnp.int32, jnp.bfloat16
  table = S((B, H, N, V), settings.get("table", f32))
  d_table, rows_dtype = S(table.shape, settings.get("d_table", f32)), table.dtype
  per_token = lambda *shape, dtype=f32: S((B, H, T, *shape), dtype)
  forward = [table, per_token(W, dtype=i32), per_token(W), per_token(W), per_token(), per_token(),
             per_token(V, dtype=bf16), per_token(R, dtype=i32), per_token(R)]
  backward = [table, d_table, per_token(W, dtype=i32), per_token(W), per_token(W), per_token(W), per_token(),
              per_token(), per_token(V, dtype=bf16), per_token(R, dtype=i32), per_token(R), per_token(W),
              per_token(W, V, dtype=rows_dtype), per_token(V, dtype=bf16)]
  fwd, bwd = settings.get("fwd", {}), settings.get("bwd", {})
  kernels = {
      "fwd_nosave": (lambda *a: st.sparse_tokens_fwd(*a, save_rows=False, **fwd), forward),
      "fwd_save": (lambda *a: st.sparse_tokens_fwd(*a, save_rows=True, **{"rows_dtype": rows_dtype, **fwd}), forward),
      "bwd": (lambda *a: st.sparse_tokens_bwd(*a, **bwd), backward),
      "bwd_packed": (lambda *a: st.sparse_tokens_bwd(None, *a[1:-2], reads=a[-2], d_m0=a[-1], **bwd),
                     backward + [per_token(R, V, dtype=rows_dtype), S(table.shape, f32)]),
  }
  os.makedirs(out, exist_ok=True)
  for name, (fn, args) in kernels.items():
    with triton_ir() as texts:
      lower_for_h200(fn, *args)
    with open(os.path.join(out, f"{name}.ttir"), "w") as f:
      f.write(texts[-1])
    print(f"{out}/{name}.ttir")


def compile_ttir(path, warps):
  import triton
  from triton.backends.compiler import GPUTarget

  kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32), options={"num_warps": int(warps), "num_stages": 1})
  with open(path + ".cubin", "wb") as f:
    f.write(kernel.asm["cubin"])
  cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
  usage = subprocess.run([cuobjdump, "-res-usage", path + ".cubin"], capture_output=True, text=True).stdout
  print(path, "warps", warps, *[line.strip() for line in usage.splitlines() if "REG" in line])


if __name__ == "__main__":
  if len(sys.argv) < 3 or sys.argv[1] not in ("dump", "compile"):
    raise SystemExit(__doc__)
  (dump if sys.argv[1] == "dump" else compile_ttir)(*sys.argv[2:])
