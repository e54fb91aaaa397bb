"""Each Pallas launch of a dense op's forward+backward against its byte and FLOP floors (DESIGN.md section 7), without a
GPU: the op is lowered for an abstract Hopper card and every launch's Triton IR is read.

    .venv/bin/python benchmarks/ops/kernel_floors.py --mixer=kda [--shape=4x4096 --chunk_size=32] \\
        [--breakdown=benchmarks/ops/2026-12-07_h100_issue49_breakdown.json]

Per launch (same-named launches summed): bytes = its operands and results, each moved once (the least it can move);
FLOPs = 2 M N K of every `tt.dot` in its program, times the trip counts of the loops around it, times its grid; the
floors at an H100 SXM's 3.35 TB/s and 989 TFLOP/s (dense bf16). With --breakdown (an `experiments.bench --what=ops
--set=breakdown=true` record), each launch's measured device time (CUPTI) beside its floors and their ratio.
"""

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

BANDWIDTH = 3.35e12  # H100 SXM HBM3, bytes/s
PEAK_FLOPS = 989e12  # H100 SXM dense bf16 (fp32 dots run at tf32's rate or below: a floor, not a bound)
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i8": 1, "i1": 1, "f64": 8, "i64": 8}


def tensor_bytes(type_text):
  """'tensor<4x4096x16x128xbf16>' -> bytes."""
  dims, _, dtype = type_text.rpartition("x")
  return math.prod(int(d) for d in dims.split("x") if d) * DTYPE_BYTES[dtype]


def dot_flops(ttir):
  """FLOPs of one program of a Triton IR module: 2 M N K per tt.dot, times the trip counts of the scf.for loops around
  it (constant bounds; the loop's bounds read from its arith.constant operands)."""
  constants, loops, flops, depth = {}, [], 0, 0
  for line in ttir.splitlines():
    if m := re.search(r"(%[\w]+) = arith\.constant (-?\d+) : i(32|64)", line):
      constants[m.group(1)] = int(m.group(2))
    if m := re.search(r"(%[\w]+) = arith\.(addi|subi|muli|divsi|ceildivsi|minsi|maxsi) (%\w+), (%\w+) : i(32|64)$",
                      line.strip()):
      a, b = constants.get(m.group(3)), constants.get(m.group(4))
      if a is not None and b is not None:
        constants[m.group(1)] = {"addi": a + b, "subi": a - b, "muli": a * b, "divsi": a // b if b else 0,
                                 "ceildivsi": -(-a // b) if b else 0, "minsi": min(a, b),
                                 "maxsi": max(a, b)}[m.group(2)]
    if m := re.search(r"tt\.dot .*: tensor<(\d+)x(\d+)x\w+> \* tensor<(\d+)x(\d+)x\w+>", line):
      M, K, _, N = map(int, m.groups())
      flops += 2 * M * N * K * math.prod(trips for _, trips in loops)
    if m := re.search(r"scf\.for %\S+ = (%\w+) to (%\w+) step (%\w+)", line):
      lo, hi, step = (constants.get(x) for x in m.groups())
      if None in (lo, hi, step):
        raise ValueError(f"a loop without constant bounds: {line.strip()}")
      loops.append((depth, max((hi - lo + step - 1) // step, 0)))
    depth += line.count("{") - line.count("}")
    while loops and depth <= loops[-1][0]:
      loops.pop()
  return flops


def launches(mixer, B, T, H, K, chunk_size):
  """[(name, grid, bytes, flops per program)] of every Pallas launch of the op's forward and backward."""
  import jax
  import jax.numpy as jnp

  from sdm_jax.ops import pallas
  from sdm_jax.testing.inputs import make_op_inputs
  from sdm_jax.testing.lowering import TRITON_CALL, lower_for_h200, triton_ir
  from sdm_jax.testing.runs import make_loss
  fn, args = make_op_inputs(mixer, B, T, H, K, K, "bfloat16", 0, initial_state=False)
  abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in args.items()}
  loss = jax.value_and_grad(make_loss(fn, "pallas", chunk_size), has_aux=True)  # what the ops mode times
  interpret, pallas.interpret = pallas.interpret, lambda: False  # lowered for the GPU, never run here
  try:
    with triton_ir() as captured:
      text = lower_for_h200(loss, abstract, jax.ShapeDtypeStruct((B, T, H, K), jnp.bfloat16),
                            jax.ShapeDtypeStruct((B, H, K, K), jnp.float32))
  finally:
    pallas.interpret = interpret
  calls = [line for line in text.splitlines() if TRITON_CALL in line]
  if len(calls) != len(captured):  # each lowered call must pair with the IR of its own program
    raise ValueError(f"{len(calls)} Triton calls in the lowered op but {len(captured)} programs captured")
  out = []
  for line, ttir in zip(calls, captured):
    name = re.search(r'name = "([^"]+)"', line) or re.search(r"tt\.func public @(\w+)", ttir)
    grid = tuple(int(x) for x in re.findall(r"grid_[xyz] = (\d+)", line)) or (1,)
    signature = line.rpartition("} : (")[2]  # (operand types) -> result types, after the attributes
    moved = sum(tensor_bytes(t) for t in re.findall(r"tensor<([^>]+)>", signature))
    out.append((name.group(1) if name else "?", math.prod(grid), moved, dot_flops(ttir)))
  return out, len(calls), len(captured)


def breakdown_entry(results, mixer, B, T, chunk_size, where):
  """The one result of an ops record these floors describe: the mixer's unbounded impl="pallas" op at B x T and
  chunk_size, with its CUPTI breakdown (a record also holds the bounded op, other shapes and chunk sizes)."""
  found = [e for e in results if e.get("mixer") == mixer and e.get("impl") == "pallas" and e.get("B") == B
           and e.get("T") == T and e.get("chunk_size") == chunk_size and e.get("lower_bound") is None
           and e.get("kernels_fwd_bwd")]
  if len(found) != 1:
    raise SystemExit(f"kernel_floors.py: --breakdown={where}: expected one unbounded {mixer} pallas result at "
                     f"{B}x{T}, chunk {chunk_size}, with a breakdown; found {len(found)}")
  return found[0]


def main():
  from sdm_jax.tables import Column, table
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mixer", default="kda")
  parser.add_argument("--shape", default="4x4096")
  parser.add_argument("--heads", type=int, default=16)
  parser.add_argument("--head_dim", type=int, default=128)
  parser.add_argument("--chunk_size", type=int, default=32)
  parser.add_argument("--breakdown", default=None)
  args = parser.parse_args()
  B, T = map(int, args.shape.split("x"))
  rows, n_calls, _ = launches(args.mixer, B, T, args.heads, args.head_dim, args.chunk_size)
  totals = defaultdict(lambda: [0, 0])
  for name, grid, moved, flops in rows:
    totals[name][0] += moved
    totals[name][1] += flops * grid
  measured = {}
  if args.breakdown:
    results = json.loads(Path(args.breakdown).read_text())["results"]
    entry = breakdown_entry(results, args.mixer, B, T, args.chunk_size, args.breakdown)
    for kernel, ms in entry["kernels_fwd_bwd"]["top"]:
      name = re.sub(r"__\d+$", "", kernel)  # XLA numbers a second launch of one kernel
      measured[name] = measured.get(name, 0) + ms
  print(f"{args.mixer} {args.shape} H {args.heads} K=V {args.head_dim} C {args.chunk_size}: {n_calls} launches")
  rows = []
  for name, (moved, flops) in sorted(totals.items(), key=lambda kv: -measured.get(kv[0], 0)):
    byte_ms, flop_ms = moved / BANDWIDTH * 1e3, flops / PEAK_FLOPS * 1e3
    ms = measured.get(name)
    rows.append({"launch": name, "moved": moved, "byte_ms": byte_ms, "flops": flops, "flop_ms": flop_ms, "ms": ms,
                 "ratio": ms / max(byte_ms, flop_ms) if ms else None})
  print(table([Column("launch", "launch"), Column("GB moved", "moved", ".3f", 1e9),
               Column("byte floor ms", "byte_ms", ".3f"), Column("GFLOP", "flops", ".1f", 1e9),
               Column("FLOP floor ms", "flop_ms", ".3f"), Column("measured ms", "ms", ".3f"),
               Column("measured / larger floor", "ratio", ".1f", suffix="x")], rows))


if __name__ == "__main__":
  main()
