"""The decode benchmark (sdm_jax/benchmarking/decode_bench.py, the registry's decode mode) on tiny CPU models (the
mode end to end, its report and plot: tests/benchmarking/test_bench.py)."""

import math

import pytest

from sdm_jax.benchmarking import decode_bench
from sdm_jax.benchmarking.decode_bench import ATTENTION, run_sweep

SIZES = {"vocab_size": 32, "width": 16, "num_layers": 4, "num_heads": 2, "head_dim": 8}
# A 4-slot window below both contexts, so the SDM hybrid's cache is full-sized at each.
OVERRIDES = ["window=4", "sdm.num_slots=16", "sdm.topk_write=2", "sdm.topk_read=2", "sdm.value_dim=8",
             "sdm.key_dim=4"]
CONTEXTS, STEPS = (8, 24), 2


def quiet(line):
  del line


@pytest.fixture(scope="module")
def records():
  configs = decode_bench.model_configs(["gdn2", "sdm", ATTENTION], **SIZES, overrides=OVERRIDES)
  return run_sweep(configs, [1, 2], CONTEXTS, steps=STEPS, reps=1, log=quiet)


def points(records, variant):
  return {(r["batch"], r["context"]): r for r in records if r["variant"] == variant}


def test_every_point_is_timed(records):
  assert len(records) == 3 * 2 * len(CONTEXTS)
  for r in records:
    assert r["error"] is None, r
    assert math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0
    assert r["tokens_per_s"] == pytest.approx(r["batch"] / (r["ms_per_step"] * 1e-3))
    attention_ms = points(records, ATTENTION)[r["batch"], r["context"]]["ms_per_step"]
    assert r["vs_attention"] == pytest.approx(attention_ms / r["ms_per_step"])
  assert {r["pattern"] for r in records} == {"DDDD", "SSSM", "AAAA"}


def test_attention_memory_grows_with_context_and_a_recurrent_one_does_not(records):
  for (batch, context), r in points(records, ATTENTION).items():
    # k and v of every layer: [context, H, head_dim] fp32 per sequence.
    assert r["cache_bytes_per_seq"] == SIZES["num_layers"] * 2 * context * SIZES["num_heads"] * SIZES["head_dim"] * 4
  for variant in ("gdn2", "sdm"):
    assert len({r["cache_bytes_per_seq"] for r in points(records, variant).values()}) == 1, variant


def test_a_recurrent_model_compiles_once_per_batch_size_and_attention_once_per_context(records):
  for variant, compiles_per_batch in (("gdn2", 1), ("sdm", 1), (ATTENTION, len(CONTEXTS))):
    compiled = [r for r in points(records, variant).values() if r["compile_s"] is not None]
    assert len(compiled) == 2 * compiles_per_batch, variant


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(monkeypatch):
  def out_of_memory(*args):
    raise MemoryError("RESOURCE_EXHAUSTED: out of memory")
  monkeypatch.setattr(decode_bench, "compile_decode", out_of_memory)
  configs = decode_bench.model_configs(["gdn"], **SIZES)
  failed = run_sweep(configs, [1], CONTEXTS, steps=STEPS, reps=1, log=quiet)
  assert len(failed) == len(CONTEXTS)
  for r in failed:
    assert r["error"].startswith("MemoryError: RESOURCE_EXHAUSTED") and r["ms_per_step"] is None
    assert r["cache_bytes_per_seq"] > 0


def test_bad_inputs_raise_naming_what_is_allowed():
  with pytest.raises(ValueError, match=r"expected some of .*'gdn2'.*'sdm'.*'attention'.*got \['gdn3'\]"):
    decode_bench.model_configs(["gdn3"], **SIZES)
  with pytest.raises(ValueError, match="'SSSM' needs at least 4 layers, got 2"):
    decode_bench.model_configs(["sdm"], **{**SIZES, "num_layers": 2})
  with pytest.raises(ValueError, match="field of .*'window'"):
    decode_bench.model_configs(["gdn"], **SIZES, overrides=["windw=4"])
  with pytest.raises(ValueError, match="contexts"):
    run_sweep({}, [1], [0])
