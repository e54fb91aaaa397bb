"""The measuring functions behind experiments/compare_impls.py and the registry's ops and sdm modes, on tiny CPU
shapes (each mode end to end: tests/benchmarking/test_bench.py)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdm_jax.benchmarking import fla_peer, op_bench
from sdm_jax.benchmarking.op_bench import merge_reports, parse_shapes, run_sweep, summary_table, write_report
from sdm_jax.benchmarking.op_compare import compare_impls, error_row, format_report
from sdm_jax.benchmarking.settings import OpsSettings
from sdm_jax.benchmarking import timing
from sdm_jax.benchmarking.timing import run_metadata
from sdm_jax.ops import MIXERS
from sdm_jax.testing.inputs import make_op_inputs, sdm_inputs

GATE_GRADS = {"gdn": {"dbeta"}, "gdn2": {"db", "dw"}}


def quiet(line):
  del line


@pytest.mark.parametrize("mixer", ["gdn2", "gdn"])
def test_compare_impls_chunk_matches_scan(mixer):
  report = compare_impls(mixer, ["scan", "chunk"], B=1, T=40, H=2, K=8, V=12, dtype="float32", chunk_size=16,
                         reps=1, log=quiet)
  rows = report["comparisons"]["scan vs chunk"]
  names = {row["quantity"] for row in rows}
  assert names == {"o", "final_state", "o (forward alone)", "final_state (forward alone)", "dq", "dk", "dv", "dg",
                   "dinitial_state"} | GATE_GRADS[mixer]
  for row in rows:
    assert row["finite"] and row["rel_err"] < 1e-5, row
  assert report["all_finite"]
  for timings in report["timings"].values():
    assert timings["fwd_ms"] > 0 and timings["fwd_bwd_ms"] > 0
  assert "dinitial_state" in format_report(report)


def test_error_row_measures_relative_error_and_flags_non_finite():
  ref = np.array([3.0, 4.0])
  row = error_row("o", np.array([3.0, 4.5]), ref)
  assert row["rel_err"] == pytest.approx(0.1) and row["max_abs"] == pytest.approx(0.5) and row["finite"]
  assert not error_row("o", np.array([3.0, np.nan]), ref)["finite"]
  assert not error_row("o", ref, np.array([np.inf, 4.0]))["finite"]


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_op_inputs_are_in_range(mixer):
  fn, args = make_op_inputs(mixer, 2, 9, 3, 4, 4, "bfloat16", 0)
  assert args["q"].dtype == jnp.bfloat16 and args["g"].dtype == jnp.float32
  assert float(args["g"].max()) <= 0 and float(args["g"].min()) < -0.1
  for name, _ in MIXERS[mixer].gates:
    assert 0 <= float(args[name].min()) and float(args[name].max()) <= 1
  o, final_state = jax.jit(lambda args: fn(args, impl="scan", chunk_size=16))(args)
  assert o.shape == (2, 9, 3, 4) and final_state.shape == (2, 3, 4, 4)


def test_parse_shapes():
  assert parse_shapes("8x2048,1x16384") == [(8, 2048), (1, 16384)]
  with pytest.raises(ValueError, match="shapes"):
    parse_shapes("8by2048")


def test_bench_sweep_records_failures_and_writes_report(tmp_path):
  records, peers = run_sweep(["gdn2"], ["chunk", "no_such_impl"], [(1, 32)], H=2, K=8, V=8, dtype="float32",
                             chunk_size=(16,), reps=2, peer=False, log=quiet)
  assert peers == {}
  good, bad = records
  assert good["chunk_size"] == 16
  assert good["error"] is None and good["fwd_ms"] > 0 and good["fwd_bwd_ms"] > 0
  assert good["fwd_tokens_per_s"] == pytest.approx(32 / (good["fwd_ms"] * 1e-3))
  assert bad["fwd_ms"] is None and "ValueError" in bad["error"] and "no_such_impl" in bad["error"]

  meta = {**run_metadata(), "config": {"reps": 2}, "peer": {"gdn2": "skipped in the test"}}
  paths = write_report(records, meta, str(tmp_path), "tiny")
  with open(paths["json"]) as f:
    saved = json.load(f)
  assert {"date", "device", "command", "jax_version", "timer", "config", "peer", "results"} <= set(saved)
  assert saved["results"] == records
  with open(paths["md"]) as f:
    markdown = f.read()
  assert "| gdn2 | chunk | 16 | 1x32 |" in markdown and "skipped in the test" in markdown
  with open(paths["png"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_sweep_goes_shape_by_shape_over_chunk_sizes_and_peer_modes():
  """Chunk sizes 16 and None (the chunk impl's rule: 64 clamped to the padded length), every mixer at a shape before
  the next shape, the programs of each compiled two at once; every peer mode loaded once (none runs on the CPU);
  the summary has a row per (mixer, shape, clock) with a column per chunk size."""
  records, peers = run_sweep(["gdn", "kda"], ["chunk"], [(1, 16), (1, 32)], H=1, K=8, V=8, dtype="float32",
                             chunk_size=(16, None), reps=1, peer=True, peer_modes=("plain", "safe_gate"),
                             compile_threads=2, log=quiet)
  assert [(r["mixer"], r["T"], r["chunk_size"]) for r in records] == [
      ("gdn", 16, 16), ("gdn", 16, 16), ("kda", 16, 16), ("kda", 16, 16),
      ("gdn", 32, 16), ("gdn", 32, 32), ("kda", 32, 16), ("kda", 32, 32)]
  assert all(r["error"] is None and r["fwd_ms"] > 0 and r["fwd_bwd_host_ms"] > 0 for r in records)
  assert peers["gdn fla safe_gate"] == "no fla peer for gdn" and set(peers) == {
      "gdn fla", "gdn fla safe_gate", "kda fla", "kda fla safe_gate"}
  lines = summary_table(records).splitlines()
  assert lines[0].startswith("| mixer | B x T | clock | chunk C16 | chunk C32 | ours fastest |") and len(lines) == 10
  assert lines[-1].startswith("| kda | 1x32 | host | ") and lines[-1].endswith(" | - / - |")  # no peer timed
  assert summary_table(records[:1]) == ""  # one program of ours, no peer: nothing to set side by side


def test_ours_are_set_against_the_fastest_peer_mode_of_each_part():
  ours = [{"impl": "pallas", "fwd_ms": 1.0, "fwd_bwd_ms": 4.0, "fwd_host_ms": 2.0, "fwd_bwd_host_ms": None}]
  peers = [{"impl": "fla", "fwd_ms": 1.5, "fwd_bwd_ms": 6.0, "fwd_host_ms": 3.0, "fwd_bwd_host_ms": 7.0},
           {"impl": "fla safe_gate", "fwd_ms": 1.8, "fwd_bwd_ms": 5.0, "fwd_host_ms": None, "fwd_bwd_host_ms": 6.5}]
  op_bench._compare_with_peers(ours, peers)
  (r,) = ours
  assert (r["vs_peer_fwd"], r["vs_peer_fwd_mode"]) == (pytest.approx(1.5), "fla")
  assert (r["vs_peer_fwd_bwd"], r["vs_peer_fwd_bwd_mode"]) == (pytest.approx(1.25), "fla safe_gate")
  assert r["vs_peer_fwd_host"] == pytest.approx(1.5) and "vs_peer_fwd_bwd_host" not in r


@pytest.mark.parametrize("peer, modes, floor", [(True, ("plain", "safe_gate"), -5.0), (True, ("plain",), None),
                                                (False, ("safe_gate",), None)])
def test_a_bounded_peer_mode_clips_every_input_sets_decay(monkeypatch, peer, modes, floor):
  """fla's safe_gate needs g >= its lower_bound: ours get the same clipped g, so both compute the same."""
  steep = lambda *a, **kw: (lambda fn, args: (fn, {**args, "g": 20.0 * args["g"] - 6.0}))(*make_op_inputs(*a, **kw))
  seen = []

  def timed(fn, arg_sets, *rest):
    seen.extend(float(jnp.min(args["g"])) for args in arg_sets)
    return {"fwd_ms": 1.0, "fwd_bwd_ms": 1.0}, np.zeros((1,), np.float32)

  monkeypatch.setattr(op_bench, "make_op_inputs", steep)
  monkeypatch.setattr(op_bench, "time_impl", timed)
  run_sweep(["kda"], ["chunk"], [(1, 16)], H=1, K=8, V=8, dtype="float32", reps=1, peer=peer, peer_modes=modes,
            log=quiet)
  assert len(seen) == 3 and (all(g == floor for g in seen) if floor else all(g < -6.0 for g in seen))


def test_bounded_times_the_impls_that_use_the_bound_again_with_it(monkeypatch):
  """bounded=true: each pallas program of a per-channel decay twice, without and with the peer's bound (fla's
  safe_gate -5 here, where no peer runs), every input set's g clipped there; the chunk impl, which ignores the bound,
  once. The tables name the bounded runs apart."""
  steep = lambda *a, **kw: (lambda fn, args: (fn, {**args, "g": 20.0 * args["g"] - 6.0}))(*make_op_inputs(*a, **kw))
  timed = []

  def time_impl(fn, arg_sets, readout, impl, chunk_size, reps, breakdown, compiled, lower_bound):
    timed.append((impl, chunk_size, lower_bound, min(float(jnp.min(args["g"])) for args in arg_sets)))
    return {"fwd_ms": 1.0, "fwd_bwd_ms": 2.0 if lower_bound is None else 1.5}, np.zeros((1,), np.float32)

  monkeypatch.setattr(op_bench, "make_op_inputs", steep)
  monkeypatch.setattr(op_bench, "time_impl", time_impl)
  records, _ = run_sweep(["kda", "gdn"], ["chunk", "pallas"], [(1, 16)], H=1, K=8, V=8, dtype="float32",
                         chunk_size=(16,), reps=1, peer=False, bounded=True, log=quiet)
  assert timed == [("chunk", 16, None, -5.0), ("pallas", 16, None, -5.0), ("pallas", 16, -5.0, -5.0),
                   ("chunk", 16, None, -5.0), ("pallas", 16, None, -5.0)]  # GDN's one decay per head takes no bound
  assert [(r["mixer"], r["impl"], r["lower_bound"]) for r in records] == [
      ("kda", "chunk", None), ("kda", "pallas", None), ("kda", "pallas", -5.0), ("gdn", "chunk", None),
      ("gdn", "pallas", None)]
  assert "| kda | pallas lower_bound=-5 | 16 | 1x16 |" in op_bench.format_table(records)
  assert "pallas lower_bound=-5 C16" in summary_table(records).splitlines()[0]


def test_the_op_gets_the_bound_and_bounded_needs_an_impl_that_uses_it():
  fn, args = make_op_inputs("kda", 1, 16, 1, 8, 8, "float32", 0, initial_state=False)
  readout = jnp.zeros((1, 16, 1, 8), jnp.float32)
  with pytest.raises(ValueError, match=r"^lower_bound: expected None or a number in \[-5, 0\) at chunk size 32"):
    op_bench.compile_impl(fn, args, readout, "chunk", None, lower_bound=-6.0)
  with pytest.raises(ValueError, match=r"^bounded: .*got \['chunk'\]"):
    op_bench.check_settings(OpsSettings(impls=("chunk",), bounded=True))
  op_bench.check_settings(OpsSettings(impls=("chunk", "pallas"), bounded=True))


def test_merge_reports_joins_runs_and_refuses_other_devices(tmp_path):
  record = lambda T: {"mixer": "kda", "impl": "pallas", "B": 1, "T": T, "tokens": T, "error": None, "fwd_ms": 1.0,
                      "fwd_tokens_per_s": T * 1e3, "fwd_bwd_ms": 2.0, "fwd_bwd_tokens_per_s": T * 5e2}
  meta = lambda date, command, device="H": {"date": date, "device": device, "jax_version": "1", "timer": "t",
                                            "command": command, "config": {}, "peer": {"kda": "fla"}}
  first = write_report([record(32)], meta("2026-01-01T00:00", "run a"), str(tmp_path / "a"), "x")["json"]
  second = write_report([record(64)], meta("2026-01-02T00:00", "run b"), str(tmp_path / "b"), "x")["json"]
  records, merged = merge_reports([first, second])
  assert [r["T"] for r in records] == [32, 64]
  assert merged["command"] == "run a ; run b" and merged["date"] == "2026-01-02T00:00"
  other = write_report([record(64)], meta("2026-01-03T00:00", "run c", "G"), str(tmp_path / "c"), "x")["json"]
  with pytest.raises(ValueError, match="device"):
    merge_reports([first, other])


def test_peer_is_skipped_with_a_reason():
  op, reason = fla_peer.load_peer("gdn")
  assert op is None and "no fla peer" in reason


def test_row_traffic_gathers_writes_and_reads_the_rows():
  from sdm_jax.benchmarking import sdm_bench
  B, T, H, N, V, W, R = 2, 4, 2, 64, 8, 3, 5
  floats, ints = sdm_inputs(B, T, H, N, V, W, R, seed=3)
  rng = np.random.default_rng(4)  # distinct written slots per (b, h): which duplicate write lands is unspecified
  k_idx = np.stack([np.stack([rng.permutation(N)[:T * W].reshape(T, W) for _ in range(H)], 1) for _ in range(B)])
  ints = {**ints, "k_idx": jnp.asarray(k_idx, jnp.int32)}
  o, table = jax.jit(lambda floats, ints: sdm_bench.row_traffic(**floats, **ints))(floats, ints)
  f = {name: np.asarray(x, np.float64) for name, x in floats.items()}
  q_idx = np.asarray(ints["q_idx"])
  want_table = np.broadcast_to(f["m0"], (B, H, N, V)).copy()
  want_o = np.zeros((B, T, H, V))
  for b in range(B):
    for h in range(H):
      for t in range(T):
        r = np.exp(f["g"][b, t, h]) * sum(f["k_w"][b, t, h, w] * f["m0"][h, k_idx[b, t, h, w]] for w in range(W))
        d = f["beta"][b, t, h] * (f["v"][b, t, h] - r)
        for w in range(W):
          want_table[b, h, k_idx[b, t, h, w]] = f["k_w"][b, t, h, w] * d
      for t in range(T):
        want_o[b, t, h] = sum(f["q_w"][b, t, h, j] * want_table[b, h, q_idx[b, t, h, j]] for j in range(R))
  np.testing.assert_allclose(table, want_table, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-6)


def test_sdm_shapes_are_those_of_the_drawn_inputs():
  from sdm_jax.benchmarking import sdm_bench
  drawn = jax.eval_shape(lambda: sdm_inputs(2, 3, 2, 16, 8, 3, 5, seed=0))
  assert drawn == sdm_bench.sdm_shapes(2, 3, 2, 16, 8, 3, 5)


def test_sdm_report_lists_times_and_errors(tmp_path):
  from sdm_jax.benchmarking import sdm_bench
  rows = [{"what": "sdm chunk", "fwd_ms": 1.5, "fwd_bwd_ms": 4.25, "fwd_host_ms": 1.75, "fwd_bwd_host_ms": 5.0},
          {"what": "addressing", "fwd_ms": 2.0},
          {"what": "sdm pallas", "error": "ValueError: nope"},
          {"what": "row traffic", "fwd_ms": 2.0, "row_bytes": 51_539_607_552, "row_gb_per_s": 25769.8}]
  paths = sdm_bench.write_report(rows, {**run_metadata(), "config": {"reps": 2}}, str(tmp_path), "tiny")
  with open(paths["json"]) as f:
    assert json.load(f)["results"] == rows
  with open(paths["md"]) as f:
    markdown = f.read()
  assert "| sdm chunk | 1.500 | 4.250 | 1.750 / 5.000 |  |" in markdown
  assert "| addressing | 2.000 | - | - / - |  |" in markdown
  assert "| sdm pallas | - | - | - / - | ValueError: nope |" in markdown
  assert "| row traffic | 2.000 | - | - / - | 51.5 GB of rows at 25770 GB/s |" in markdown


def test_median_ms_off_the_gpu_is_wall_time_of_synchronised_calls():
  """On the CPU there is no CUPTI: the timer says so, kernel_times refuses, and median_ms times each
  call with its sync (a sync that sleeps shows up in the median)."""
  import time
  assert timing.timer_name().startswith("host wall clock")
  with pytest.raises(RuntimeError, match="GPU"):
    timing.kernel_times(lambda: None)
  synced = []
  slow_sync = lambda result: (synced.append(result), time.sleep(0.02))
  ms = timing.median_ms(lambda x: x + 1, [(1,), (2,)], reps=3, sync=slow_sync)
  assert 20 <= ms < 1000, ms
  assert synced == [2, 3, 2, 3, 2]  # two warm-up runs, then three timed ones rotating the input sets


def test_back_to_back_ms_syncs_once_after_the_warm_calls_and_rotates_the_sets():
  """The second timer: one warm call (synced) per input set, then `reps` calls rotating the sets with a single
  sync at the end, per call."""
  import time
  calls, synced = [], []
  def fn(x):
    calls.append(x)
    time.sleep(0.01)
    return x
  ms = timing.back_to_back_ms(fn, [(1,), (2,)], reps=4, sync=synced.append)
  assert calls == [1, 2, 1, 2, 1, 2] and synced == [1, 2, 2]
  assert 10 <= ms < 1000, ms


def _benchmark_script(name):
  """The module of benchmarks/<name>.py (a script, not a package module)."""
  import importlib.util
  import pathlib
  spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).parents[2] / "benchmarks" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_ncu_target_runs_the_sdm_op_forward_and_backward(capsys):
  """benchmarks/ncu_target.py, the Nsight Compute steps' target, at a small SDM shape (interpret mode here)."""
  target = _benchmark_script("ncu_target")
  target.main(["ncu_target.py", "sdm", "8", "512", "16"])
  assert "ncu target sdm: done" in capsys.readouterr().out


def test_kernel_registers_dumps_the_token_kernels_triton_ir(tmp_path):
  """benchmarks/kernel_registers.py's first step (its second needs a Triton install): the four token kernels'
  Triton IR for an abstract H200, at a launch given on its command line."""
  tool = _benchmark_script("kernel_registers")
  tool.dump(str(tmp_path), "{'bwd': {'block_v': 32, 'num_warps': 4}}")
  names = sorted(p.name for p in tmp_path.iterdir())
  assert names == ["bwd.ttir", "bwd_packed.ttir", "fwd_nosave.ttir", "fwd_save.ttir"]
  for name in names:
    text = (tmp_path / name).read_text()
    assert text.startswith("module @sparse_tokens_") and "tt.func" in text
