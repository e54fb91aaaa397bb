"""The `kernels` mode (sdm_jax/benchmarking/kernel_bench.py) on the CPU, kernels in interpret mode at tiny shapes: it
times every entry of `KERNELS`, the SDM kernels and addressing included (the dense op's kernels, at grid points, are
in tests/benchmarking/test_bench.py), every kernel module's settings are some entry's, and a kernel registered in
`KERNELS` runs at its defaults, its candidates and a grid: the README's "Adding a kernel"."""

import dataclasses
import functools
import importlib
import json
import pathlib
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import pallas_kernels
from pallas_kernels.launch import one_at_a_time
from sdm_jax.benchmarking import kernel_bench, registry
from sdm_jax.benchmarking.kernel_bench import KERNELS, Kernel
from sdm_jax.training.config import ConfigError


def _run(tmp_path, overrides):
  """registry.bench("kernels", overrides) at the mode's CPU values; returns (its records, its markdown)."""
  paths = registry.bench("kernels", ["shapes=1x16", "reps=1", *overrides], out_dir=str(tmp_path), tag="tiny_kernels",
                         log=lambda line: None)
  return json.loads(pathlib.Path(paths["json"]).read_text())["results"], pathlib.Path(paths["md"]).read_text()


@dataclasses.dataclass(frozen=True)
class DoublingSettings:
  """The throwaway kernel's launch settings: rows per program."""
  rows: int

  @classmethod
  def defaults(cls, shape=None):
    return cls(rows=8)

  @classmethod
  def candidates(cls, shape=None):
    return one_at_a_time(cls, shape, rows=(4, 16))


def _doubling(x_ref, o_ref):
  o_ref[...] = 2 * x_ref[...]


def doubling(x, *, settings, interpret):
  """2 x for x [M, D], settings.rows rows a program."""
  rows, D = settings.rows, x.shape[1]
  block = pl.BlockSpec((rows, D), lambda i: (i, 0))
  return pl.pallas_call(_doubling, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // rows,),
                        in_specs=[block], out_specs=block, interpret=interpret)(x)


DOUBLING = Kernel(
    DoublingSettings,
    inputs=lambda point, seed, made: {"x": jnp.asarray(np.random.default_rng(seed).standard_normal(
        (point.shape.B * point.shape.T, 16), np.float32))},
    run=lambda point, settings, interpret: functools.partial(doubling, settings=settings, interpret=interpret),
    memory_bound=True)


def test_a_registered_kernel_runs_at_its_defaults_candidates_and_grid(tmp_path, monkeypatch):
  monkeypatch.setitem(KERNELS, "doubling", DOUBLING)
  x = jnp.arange(32.0).reshape(2, 16)
  np.testing.assert_array_equal(doubling(x, settings=DoublingSettings(rows=2), interpret=True), 2 * x)
  for overrides, launches in ((["parts=doubling"], ["default"]),
                              (["parts=doubling", "candidates=true"], ["default", "rows=4", "rows=16"]),
                              (["parts=doubling", "grid.doubling.rows=16,4"], ["rows=16", "rows=4"])):
    records, markdown = _run(tmp_path, overrides)
    assert [(r["kernel"], r["launch"]) for r in records] == [("doubling", launch) for launch in launches]
    for r in records:
      assert r["error"] is None and 0 < r["ms"] < 1e5 and r["mixer"] is None, r
      assert r["floor_ms"] == pytest.approx(2 * 16 * 16 * 4 / kernel_bench.BANDWIDTH * 1e3)  # 16 rows read, written
      assert r["settings"] == {"rows": int(r["launch"].partition("=")[2] or 8)}
      assert f"| - | 1x16 | - | doubling | {r['launch']} |" in markdown
  with pytest.raises(ConfigError, match=r"grid.doubling.cols: expected a field of doubling's settings \('rows',\)"):
    registry.check("kernels", ["grid.doubling.cols=4"])


def test_the_sdm_kernels_and_addressing_run_in_the_mode(tmp_path):
  records, markdown = _run(tmp_path, ["parts=sparse_tokens_fwd,sparse_tokens_bwd,product_key_address"])
  assert [r["kernel"] for r in records] == ["sparse_tokens_fwd", "sparse_tokens_fwd save_rows", "sparse_tokens_bwd",
                                            "product_key_address"]
  for r in records:
    assert r["error"] is None and 0 < r["ms"] < 1e5 and r["launch"] == "default", r
  assert records[0]["settings"] == {"block_v": 64, "num_warps": 8}
  assert "| - | 1x16 | - | sparse_tokens_bwd | default |" in markdown


def test_the_mode_runs_every_kernel_by_default():
  """Every entry of KERNELS, the dense ones at each mixer and chunk size, the others once a shape."""
  settings = registry.settings("kernels", ["shapes=1x32,2x64", "mixers=gdn,kda", "chunk_sizes=16,32"])
  points = kernel_bench.points(settings)
  assert [(p.mixer, p.shape.B, p.shape.chunk_size) for p, _ in points] == [
      ("gdn", 1, 16), ("gdn", 1, 32), ("kda", 1, 16), ("kda", 1, 32), (None, 1, None),
      ("gdn", 2, 16), ("gdn", 2, 32), ("kda", 2, 16), ("kda", 2, 32), (None, 2, None)]
  assert {name for _, names in points for name in names} == set(KERNELS)
  assert points[4][1] == ["sparse_tokens_fwd", "sparse_tokens_bwd", "product_key_address"]


def test_every_kernel_modules_settings_are_timed():
  """A settings class of a kernel module (its SETTINGS; tests/pallas_kernels/test_launch_settings.py holds every
  kernel module to listing them) that no entry of KERNELS times fails here."""
  listed = set()
  for module in pkgutil.iter_modules(pallas_kernels.__path__):
    listed |= set(getattr(importlib.import_module(f"pallas_kernels.{module.name}"), "SETTINGS", ()))
  assert listed == {entry.settings for entry in KERNELS.values()}


def test_a_lower_bound_reaches_the_gram_kernels_and_clips_g(tmp_path):
  point = kernel_bench.Point("kda", kernel_bench.Shape(B=1, T=16, H=1, K=16, V=16, dtype="float32", chunk_size=16),
                             -1.0)
  for name in ("intra_chunk", "intra_chunk_bwd"):
    assert KERNELS[name].run(point, None, True).keywords["lower_bound"] == -1.0
  assert float(jnp.min(kernel_bench._cumsum_inputs(point, 0, {})["g"])) == -1.0  # the draw goes below -1
  records, markdown = _run(tmp_path, ["mixers=kda", "parts=intra_chunk", "chunk_sizes=16", "head_dim=16", "heads=1",
                                      "dtype=float32", "lower_bound=-5"])
  assert [(r["lower_bound"], r["error"]) for r in records] == [(-5.0, None)]
  assert "| -5 |" in markdown


@pytest.mark.parametrize("override,message", [
    ("parts=state_pas", r"parts: expected some of \('mixer_inputs', .* \(none: all\), got \['state_pas'\]"),
    ("num_slots=1000", "num_slots: expected a perfect square"),
    ("topk=8", "topk: expected a power of two >= 16"),
    ("mixers=gdn lower_bound=-1", r"lower_bound: bounds a per-channel decay, expected mixers without \['gdn'\]"),
    ("lower_bound=-50", r"lower_bound: expected None or a number in \[-5, 0\) at chunk size 32"),
    ("grid.sparse_tokens_fwd.warps=4", r"expected a field of sparse_tokens_fwd's settings \('block_v', 'num_warps'\)"),
])
def test_bad_settings_are_named(override, message):
  with pytest.raises(ConfigError, match=message):
    registry.check("kernels", override.split())
