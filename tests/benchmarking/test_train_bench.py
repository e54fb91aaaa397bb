"""The whole-model benchmark on the CPU: the measurement in-process against what it says it measured, the FLOP
count, and a failing entry's process (one real entry through its own process and the report it writes:
tests/benchmarking/test_bench.py)."""

import math

import ml_collections
import numpy as np
import pytest

from sdm_jax.benchmarking import train_bench
from sdm_jax.models import default_config

TINY = "experiments/configs/mqar.py:demo"
# A one-layer attention model compiles fastest on the CPU; the loop machinery does not depend on the mixer.
TINY_OVERRIDES = ["model.pattern=\"A\"", "model.num_layers=1"]


def specs(**kw):
  return train_bench.build_specs([TINY], batch=2, seq_len=16, steps=2, warmup=0, log_every=2,
                                 overrides=TINY_OVERRIDES, **kw)


def test_build_specs_expands_remat_policies_and_peers():
  built = specs(remats=["none", "dots"], peers=["kda"])
  assert [s["name"] for s in built] == ["demo remat=none", "demo remat=dots", "fla kda"]
  assert [s["model"]["remat"] for s in built[:2]] == ["none", "dots"]
  assert built[0]["model"]["pattern"] == "A" and built[0]["batch"] == 2 and built[0]["seq_len"] == 16
  assert built[2]["peer"] == "kda" and built[2]["mlp_hidden"] == round(4.0 * 64)
  with pytest.raises(ValueError, match="overrides: expected model.<field>=value"):
    train_bench.build_specs([TINY], overrides=["model.no_such_field=1"])
  with pytest.raises(ValueError, match="configs: expected 'path/to/config.py:variant'"):
    train_bench.build_specs(["no/such/config.py:x"])


def test_docs_adds_packed_entries_and_checks_its_values():
  built = specs(docs=(0, 4))
  assert [(s["name"], s["docs"]) for s in built] == [("demo remat=none", 0), ("demo remat=none docs=4", 4)]
  for bad in ((1,), (17,), (), (True,)):
    with pytest.raises(ValueError, match="docs: expected 0"):
      specs(docs=bad)


def test_packed_random_rows_hold_documents_with_their_positions():
  rows = train_bench.RandomTokens(3, 16, 50, docs=4)
  first, second = next(rows), next(rows)
  for batch in (first, second):
    ids, positions = batch["segment_ids"], batch["positions"]
    assert ids.shape == positions.shape == (3, 16)
    for row_ids, row_positions in zip(ids, positions):
      assert sorted(set(row_ids.tolist())) == [1, 2, 3, 4] and (np.diff(row_ids) >= 0).all()
      starts = np.concatenate([[True], row_ids[1:] != row_ids[:-1]])
      expected = np.arange(16) - np.maximum.accumulate(np.where(starts, np.arange(16), 0))
      np.testing.assert_array_equal(row_positions, expected)
  assert (first["segment_ids"] != second["segment_ids"]).any()  # each rotated set cut its own way
  assert "segment_ids" not in next(train_bench.RandomTokens(3, 16, 50))


def test_measure_reports_steps_tokens_and_flops():
  spec = specs()[0]
  result = train_bench.measure(spec)
  assert result["params"] > result["non_embedding_params"] > 0
  assert math.isfinite(result["loss"])
  for key in ("ms_per_step_synced", "ms_per_step_loop"):
    assert result[key] > 0
  assert result["tokens_per_s"] == pytest.approx(2 * 16 / result["ms_per_step_loop"] * 1e3)
  model = ml_collections.ConfigDict(spec["model"])
  flops = 6 * result["non_embedding_params"] + train_bench.mixer_flops_per_token(model, 16)
  assert result["flops_per_token"] == pytest.approx(flops)


def test_measure_trains_on_packed_rows():
  result = train_bench.measure(specs(docs=(4,))[0])
  assert result["docs"] == 4 and result["name"] == "demo remat=none docs=4"
  assert math.isfinite(result["loss"]) and result["ms_per_step_loop"] > 0


def test_mixer_flops_count_each_letter():
  c = default_config()
  c.update(num_layers=4, pattern="DSAM", num_heads=2, head_dim=8, value_dim=4, chunk_size=16, window=6,
           sdm=dict(num_heads=3, value_dim=5, topk_write=2, topk_read=7, num_slots=64, key_dim=4))
  delta = 2 * (6 * 8 * 4 + 2 * 16 * (8 + 4))
  sliding, full = 2 * 4 * 8 * 6, 2 * 4 * 8 * 50
  sdm = 3 * (2 * 5 * (3 * 2 + 7) + 4 * 8 * 4 * 2)
  assert train_bench.mixer_flops_per_token(c, 100) == 3 * (delta + sliding + full + sdm)


def test_a_failing_entry_is_recorded_not_raised(tmp_path):
  bad = specs()[0]
  bad["model"]["remat"] = "everything"
  result = train_bench.run_process(bad, str(tmp_path), 600, log=lambda line: None)
  assert "remat: expected one of" in result["error"]
  assert "error:" in train_bench.table([result])


def test_report_lists_each_entrys_kernels_where_it_has_them():
  timed = {"name": "a docs=8", "kernel_time": {"total_ms": 2.5, "kernels": 2, "top": [("fusion_1", 2.0), ("gemm", 0.5)]}}
  text = train_bench.kernel_lists([timed, {"name": "b", "kernel_time": None}])
  assert "a docs=8, one step: 2.500 ms in 2 distinct kernels" in text and "`fusion_1`" in text
  assert "- b" not in text and train_bench.kernel_lists([{"name": "b"}]) == ""


def test_a_batch_given_is_one_step_unless_the_accumulation_is_set():
  paper = "experiments/configs/paper.py:kda_340m"
  assert train_bench.build_specs([paper])[0]["train"]["gradient_accumulation_steps"] == 32  # 128 rows as 32 x 4
  assert train_bench.build_specs([paper], batch=4)[0]["train"]["gradient_accumulation_steps"] == 1
  built = train_bench.build_specs([paper], batch=8, overrides=["train.gradient_accumulation_steps=2"])[0]
  assert (built["batch"], built["train"]["gradient_accumulation_steps"]) == (8, 2)


def test_measure_steps_through_accumulation(monkeypatch):
  from sdm_jax.training import steps
  seen = []
  real = steps.accumulated_gradients
  monkeypatch.setattr(steps, "accumulated_gradients", lambda model, batch, n, *a: seen.append(n) or real(
      model, batch, n, *a))
  steps._jitted_train_step.cache_clear()
  spec = train_bench.build_specs([TINY], batch=2, seq_len=16, steps=2, warmup=0, log_every=2,
                                 overrides=[*TINY_OVERRIDES, "train.gradient_accumulation_steps=2"])[0]
  result = train_bench.measure(spec)
  assert seen == [2] and math.isfinite(result["loss"])
