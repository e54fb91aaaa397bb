"""benchmarks/ops/kernel_floors.py: the FLOPs of a Triton IR program count each dot once per trip of the loops around
it, and the op's forward+backward lowers to the launches its breakdown names, each with the bytes it moves."""

import importlib.util
import pathlib

import pytest

PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "ops" / "kernel_floors.py"
spec = importlib.util.spec_from_file_location("kernel_floors", PATH)
kernel_floors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel_floors)

DOT = "%{0} = tt.dot %a, %b, %c : tensor<16x32xbf16> * tensor<32x64xbf16> -> tensor<16x64xf32>"


def test_a_dot_counts_once_per_trip_of_the_loops_around_it():
  ir = "\n".join([
      "%c0 = arith.constant 0 : i32", "%c1 = arith.constant 1 : i32", "%c4 = arith.constant 4 : i32",
      "%c3 = arith.constant 3 : i32", "%n = arith.muli %c4, %c3 : i32", DOT.format(0),
      "%1 = scf.for %i = %c0 to %n step %c1 iter_args(%x = %0) -> (tensor<16x64xf32>) : i32 {",
      "  %2 = scf.for %j = %c0 to %c4 step %c1 iter_args(%y = %x) -> (tensor<16x64xf32>) : i32 {",
      "    " + DOT.format(3), "    scf.yield %3 : tensor<16x64xf32>", "  }",
      "  " + DOT.format(4), "  scf.yield %4 : tensor<16x64xf32>", "}", DOT.format(5)])
  one = 2 * 16 * 64 * 32
  assert kernel_floors.dot_flops(ir) == one * (1 + 12 * 4 + 12 + 1)


def test_a_loop_bound_it_cannot_read_is_an_error():
  ir = "%c0 = arith.constant 0 : i32\n%1 = scf.for %i = %c0 to %arg3 step %c0 : i32 {\n}"
  with pytest.raises(ValueError, match="constant bounds"):
    kernel_floors.dot_flops(ir)


def test_the_ops_launches_with_their_bytes():
  B, T, H, K, C = 1, 64, 1, 16, 16
  rows, calls, programs = kernel_floors.launches("kda", B, T, H, K, C)
  assert calls == programs == len(rows) == 9
  names = [name for name, *_ in rows]
  assert names.count("delta_rule_state_pass") == 2 and "delta_rule_intra_chunk_bwd" in names
  moved = dict((name, nbytes) for name, _, nbytes, _ in rows)
  # chunk_cumsum reads g [B, T, H, K] fp32 and writes its cumsum: at least both, once.
  assert moved["delta_rule_chunk_cumsum"] >= 2 * B * T * H * K * 4
  assert all(flops >= 0 for *_, flops in rows) and any(flops > 0 for *_, flops in rows)


def test_the_breakdown_is_the_unbounded_pallas_op_at_the_shape_and_chunk_size():
  """An ops record also holds the bounded op, other impls, shapes and chunk sizes: the floors pair with one result."""
  top = {"top": [["delta_rule_pair_bwd", 1.0]]}
  base = dict(mixer="kda", impl="pallas", B=4, T=4096, chunk_size=32, lower_bound=None, kernels_fwd_bwd=top)
  results = [base, {**base, "lower_bound": -5.0}, {**base, "chunk_size": 64}, {**base, "T": 2048},
             {**base, "impl": "chunk"}, {**base, "mixer": "gdn2"}]
  assert kernel_floors.breakdown_entry(results, "kda", 4, 4096, 32, "r.json") is base
  with pytest.raises(SystemExit, match="expected one unbounded kda pallas result at 4x4096, chunk 16"):
    kernel_floors.breakdown_entry(results, "kda", 4, 4096, 16, "r.json")
  with pytest.raises(SystemExit, match="found 2"):
    kernel_floors.breakdown_entry(results + [base], "kda", 4, 4096, 32, "r.json")
