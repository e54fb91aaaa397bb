"""The benchmark registry (sdm_jax/benchmarking/registry.py) on the CPU: every mode at tiny shapes through
`registry.bench` as experiments/bench.py calls it (the report it writes, the peer skipped with a note, the host
timer in place of CUPTI), the settings it resolves, and the command line with --base=HEAD in one subprocess."""

import importlib
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from sdm_jax.benchmarking import fla_peer, registry, trees
from sdm_jax.training.config import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEER_ABSENT = ("torch is not installed", "torch sees no CUDA device")
# Each mode at its smallest: one compile per shape, one timed run.
TINY = {
    "train": ['overrides=model.pattern="A",model.num_layers=1', "batch=2", "seq_len=16", "steps=2", "warmup=0",
              "log_every=2"],
    "sdm": ["shapes=1x16", "sdm_heads=1", "num_slots=64", "value_dim=8", "topk=4", "gdn_heads=1", "gdn_head_dim=8",
            "gdn_chunk_size=16", "address_rows=16", "address_dim=8", "impls=chunk", "reps=1", "breakdown=true"],
    "decode": ["variants=gdn,attention", "batches=1", "contexts=8", "steps=2", "reps=1", "width=16", "layers=1",
               "heads=2", "head_dim=8"],
    "sdm_memory": ["entries=chunk,scan", "shape=1x16", "heads=1", "num_slots=64", "value_dim=8", "topk=4", "reps=1",
                   "compile_only=false"],
    "packed": ["mixers=gdn,sdm", "shapes=1x16", "docs=3", "heads=1", "head_dim=8", "sdm_heads=1", "num_slots=64",
               "sdm_value_dim=8", "impl=scan", "reps=1", "breakdown=true"],
    "kernels": ["shapes=1x16", "parts=mixer_inputs,chunk_cumsum,intra_chunk,state_pass,state_pass_bwd,intra_chunk_bwd",
                "grid.chunk_cumsum.num_warps=2,4", "reps=1"],
}


def run_mode(what, tmp_path, extra=()):
  """registry.bench of one mode at TINY; returns (its report's JSON, its markdown, the logged lines)."""
  lines = []
  paths = registry.bench(what, [*TINY[what], *extra], out_dir=str(tmp_path), tag=f"tiny_{what}", log=lines.append)
  with open(paths["json"]) as f:
    report = json.load(f)
  assert report["device"] == "cpu" and report.get("config", {})
  return report, pathlib.Path(paths["md"]).read_text(), lines


def test_the_registry_lists_every_mode_and_its_settings():
  assert list(registry.MODES) == ["ops", "train", "sdm", "decode", "sdm_memory", "packed", "kernels"]
  listing = registry.describe()
  for name, entry in registry.MODES.items():
    assert f"{name}: {entry.description}" in listing
    assert set(entry.cpu) <= set(vars(entry.settings())), name
    module = importlib.import_module(entry.module)
    assert callable(module.bench) and callable(module.check_settings), name
  assert "shapes=8x2048,4x4096,2x8192,1x16384,1x32768 (CPU: 1x256)" in listing


def test_settings_apply_cpu_values_then_overrides_and_name_bad_ones():
  assert registry.settings("ops").shapes[0] == "8x2048"
  cpu = registry.settings("ops", ["heads=4", "peer=false", "value_dim=none"], backend="cpu")
  assert (cpu.shapes, cpu.heads, cpu.head_dim, cpu.peer, cpu.value_dim) == (("1x256",), 4, 32, False, None)
  grid = registry.settings("kernels", ["grid.state_pass.block_v=16,32", "grid.intra_chunk.num_warps=2"]).grid
  assert grid == {"state_pass.block_v": (16, 32), "intra_chunk.num_warps": (2,)}
  with pytest.raises(ConfigError, match=r"what: expected one of .*got 'opz' \(did you mean 'ops'\?\)"):
    registry.settings("opz")
  with pytest.raises(ConfigError, match=r"ops setting 'mixrs=kda': .*\(did you mean 'mixers'\?\)"):
    registry.settings("ops", ["mixrs=kda"])
  with pytest.raises(ConfigError, match="heads: expected int, got 'two'"):
    registry.settings("ops", ["heads=two"])
  with pytest.raises(ConfigError, match="peer: expected true or false"):
    registry.settings("ops", ["peer=maybe"])
  with pytest.raises(ConfigError, match=r"ops setting mixers: expected some of .*got \['kdb'\]"):
    registry.check("ops", ["mixers=kdb"])
  assert registry.settings("ops", ["chunk_size=16,64", "peer_modes=plain,safe_gate"]).chunk_size == (16, 64)
  with pytest.raises(ConfigError, match=r"ops setting chunk_size: expected a power of two .*got 48"):
    registry.check("ops", ["chunk_size=32,48"])
  with pytest.raises(ConfigError, match=r"ops setting peer_modes: expected some of \('plain', 'safe_gate'\)"):
    registry.check("ops", ["peer_modes=fast"])
  assert registry.check("ops", ["impls=pallas", "bounded=true"]).bounded
  with pytest.raises(ConfigError, match=r"ops setting bounded: .*expected one in impls, got \['chunk'\]"):
    registry.check("ops", ["bounded=true"])
  with pytest.raises(ConfigError, match=r"ops setting compile_threads: expected an integer >= 1, got 0"):
    registry.check("ops", ["compile_threads=0"])
  with pytest.raises(ConfigError, match="sdm setting num_slots: expected a perfect square"):
    registry.check("sdm", ["num_slots=1000"])
  with pytest.raises(ConfigError, match=r"kernels setting grid.state_pass.warps: expected a field of"):
    registry.check("kernels", ["grid.state_pass.warps=2"])
  with pytest.raises(ConfigError, match="merge: the decode mode has no merge"):
    registry.bench("decode", merge=["a.json"])


def test_ops_shares_the_gpu_with_its_peer_only_when_it_times_one():
  env = registry.MODES["ops"].env
  assert env(registry.settings("ops")) == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
  assert env(registry.settings("ops", ["peer=false"])) == {}


def test_merge_writes_one_ops_report_of_several(tmp_path):
  from sdm_jax.benchmarking.op_bench import write_report
  record = lambda T: {"mixer": "kda", "impl": "pallas", "B": 1, "T": T, "tokens": T, "error": None, "fwd_ms": 1.0,
                      "fwd_tokens_per_s": T * 1e3, "fwd_bwd_ms": 2.0, "fwd_bwd_tokens_per_s": T * 5e2}
  meta = lambda date: {"date": date, "device": "H", "jax_version": "1", "timer": "t", "command": date, "config": {}}
  runs = [write_report([record(T)], meta(f"2026-01-0{i + 1}T00:00"), str(tmp_path / str(T)), "x")["json"]
          for i, T in enumerate((32, 64))]
  paths = registry.bench("ops", merge=runs, out_dir=str(tmp_path), tag="merged", log=lambda line: None)
  assert [r["T"] for r in json.loads(pathlib.Path(paths["json"]).read_text())["results"]] == [32, 64]


def test_train_runs_each_entry_in_its_process_and_skips_the_fla_peer(tmp_path):
  report, markdown, _ = run_mode("train", tmp_path)
  (result,) = report["results"]
  assert not result.get("error") and result["ms_per_step_loop"] > 0 and result["name"] == "demo remat=none"
  assert (result["devices"], result["fsdp"]) == (1, False)
  assert report["config"]["configs"] == ["experiments/configs/mqar.py:demo"]  # the CPU value
  assert "| demo remat=none |" in markdown and f"fla peers kda not timed: {fla_peer.unavailable()}" in markdown
  assert next(tmp_path.glob("*_tiny_train.png")).stat().st_size > 0


def test_sdm_times_every_part(tmp_path):
  report, markdown, _ = run_mode("sdm", tmp_path)
  rows = {r["what"].split(" 1x16")[0].split(" rows=")[0]: r for r in report["results"]}
  assert set(rows) == {"sdm chunk C=16", "gdn chunk C=16", "sdm row traffic only, XLA", "product_key_address xla",
                       "product_key_address pallas"}
  for row in rows.values():
    assert row.get("error") is None and 0 < row["fwd_ms"] < 1e5, row
  for name in ("sdm chunk C=16", "gdn chunk C=16"):
    assert 0 < rows[name]["fwd_bwd_ms"] < 1e5 and 0 < rows[name]["compile_fwd_s"] < 1e5, rows[name]
  assert 0 < rows["product_key_address xla"]["compile_s"] < 1e5
  traffic = rows["sdm row traffic only, XLA"]
  assert traffic["row_bytes"] == 16 * (2 * 4 + 4) * 8 * 4  # B T H (W + R + W) V fp32
  assert traffic["row_gb_per_s"] == pytest.approx(traffic["row_bytes"] / (traffic["fwd_ms"] * 1e-3) / 1e9)
  assert "breakdown: no kernel list" in markdown


def test_decode_writes_json_markdown_and_plot(tmp_path):
  report, markdown, lines = run_mode("decode", tmp_path)
  assert {"date", "device", "command", "config", "model_configs", "results"} <= set(report)
  assert [(r["variant"], r["context"]) for r in report["results"]] == [("gdn", 8), ("attention", 8)]
  assert all(r["error"] is None and r["tokens_per_s"] > 0 for r in report["results"])
  assert "| gdn | D | 1 | 8 |" in markdown and "| attention | A | 1 | 8 |" in markdown
  assert next(tmp_path.glob("*_tiny_decode.png")).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert lines[-1].rstrip().endswith(markdown.rstrip().splitlines()[-1])


def test_sdm_memory_compares_every_entry_with_the_first(tmp_path):
  report, markdown, _ = run_mode("sdm_memory", tmp_path)
  chunk, scan = report["results"]
  for r in (chunk, scan):
    assert r["error"] is None and r["saved_bytes"] > 0 and r["temp_bytes"] > 0 and r["fwd_bwd_ms"] > 0, r
    assert r["peak_bytes"] is None  # the CPU keeps no memory statistics
  # The scan is the reference the chunked op is held to: the same numbers, in fp32.
  assert scan["o_rel_err"] < 1e-5 and scan["worst_grad_rel_err"] < 1e-4
  assert "| chunk |" in markdown and "| scan |" in markdown


def test_sdm_memory_launch_entries(tmp_path):
  """A launch sweep is entries that differ after '@': each reaches the op, and the results stay the first entry's."""
  report, markdown, _ = run_mode("sdm_memory", tmp_path, ["entries=pallas:float32:1:bfloat16,"
                                                          "pallas:float32:1:bfloat16@16x4/16x2", "value_dim=32"])
  default, tuned = report["results"]
  assert tuned["launch"] == [[16, 4], [16, 2]] and "launch" not in default
  assert tuned["error"] is None and tuned["o_rel_err"] == 0 and tuned["worst_grad_rel_err"] < 1e-6, tuned
  assert "| pallas:float32:1:bfloat16@16x4/16x2 |" in markdown
  from sdm_jax.benchmarking.sdm_memory import parse_entry
  assert parse_entry("pallas@32x4/64x8") == ("pallas", {"launch": ((32, 4), (64, 8))})
  assert parse_entry("pallas:float32:1:bfloat16:bfloat16") == ("pallas", {
      "rows_dtype": "float32", "rows_segments": 1, "table_dtype": "bfloat16", "table_grad_dtype": "bfloat16"})
  for bad in ("chunk@64x8/64x8", "pallas@64x8", "pallas@64x7/64x8", "pallas@8x8/64x8", "pallas:float32@64x8/64x8",
              "pallas:float32:1:float32:float16", "pallas:float32:1:float32:float32:float32"):
    with pytest.raises(ValueError, match="entries"):
      parse_entry(bad)


def test_packed_times_both_layouts_on_both_clocks(tmp_path):
  report, markdown, _ = run_mode("packed", tmp_path)
  assert [(r["mixer"], r["part"]) for r in report["results"]] == [("gdn", "fwd"), ("gdn", "fwd_bwd"), ("sdm", "fwd"),
                                                                  ("sdm", "fwd_bwd")]
  for r in report["results"]:
    assert r["error"] is None and "not finite" not in r["note"], r
    for key in ("unpacked_ms", "packed_ms", "unpacked_host_ms", "packed_host_ms"):
      assert 0 < r[key] < 1e5, (key, r)
    assert r["ratio"] == pytest.approx(r["packed_ms"] / r["unpacked_ms"])
  assert "| gdn | 1x16 | chunk 16 H=1 K=V=8 | fwd |" in markdown
  assert "breakdown: no kernel list, CUPTI is not available" in markdown
  assert all(r["packed_kernels"] is None for r in report["results"])
  from sdm_jax.benchmarking import packed_bench
  listed = {**report["results"][0], "unpacked_kernels": {"total_ms": 1.0, "kernels": 1, "top": [("a", 1.0)]},
            "packed_kernels": {"total_ms": 1.5, "kernels": 2, "top": [("a", 1.0), ("mask", 0.5)]}}
  table = packed_bench.format_table([listed])
  assert "- gdn 1x16 chunk 16 H=1 K=V=8 fwd packed: 1.500 ms in 2 distinct kernels\n  - 1.000 ms `a`" in table
  assert table.index("fwd unpacked: 1.000 ms") < table.index("fwd packed: 1.500 ms")


def test_kernels_times_every_kernel_at_every_grid_point(tmp_path):
  report, markdown, _ = run_mode("kernels", tmp_path)
  launches = [(r["kernel"], r["launch"]) for r in report["results"]]
  assert launches == [("reference_inputs", "XLA"), ("mixer_inputs", "default"), ("cumsum", "XLA"),
                      ("chunk_cumsum", "num_warps=2"), ("chunk_cumsum", "num_warps=4"),
                      ("intra_chunk save_inverse", "default"), ("state_pass", "default"),
                      ("state_pass save_states", "default"), ("state_pass_bwd", "default"),
                      ("intra_chunk_bwd", "default")]
  for r in report["results"]:
    assert r["error"] is None and 0 < r["ms"] < 1e5, r
  assert [r["settings"]["num_warps"] for r in report["results"] if r["kernel"] == "chunk_cumsum"] == [2, 4]
  assert report["results"][0]["floor_ms"] > 0 and "| gdn2 | 1x16 | 16 | chunk_cumsum | num_warps=2 |" in markdown


def test_link_trees_pairs_points_and_takes_base_over_this():
  entry = registry.MODES["ops"]
  point = {"mixer": "kda", "impl": "pallas", "B": 1, "T": 64}
  records = [{**point, "tree": "this", "fwd_ms": 2.0, "fwd_bwd_ms": None, "fwd_host_ms": 4.0},
             {**point, "impl": "fla", "tree": "this"},
             {**point, "tree": "base", "fwd_ms": 3.0, "fwd_bwd_ms": 5.0, "fwd_host_ms": 10.0},
             {**point, "lower_bound": -5.0, "tree": "this", "fwd_ms": 1.0}]  # a bounded run pairs only with one
  trees.link_trees(records, entry)
  assert records[0]["vs_base_fwd_ms"] == pytest.approx(1.5) and records[0]["vs_base_fwd_bwd_ms"] is None
  assert records[1]["vs_base_fwd_ms"] is None and "vs_base_fwd_ms" not in records[2]
  assert records[0]["vs_base_fwd_host_ms"] == pytest.approx(2.5) and records[3]["vs_base_fwd_ms"] is None
  assert ("| kda | pallas | - | - | 1 | 64 | this | 2 | - | 4 | - | 1.50x | - | 2.50x | - |  |"
          in trees.compare_table(records, entry))


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
def test_ops_from_the_command_line_beside_a_commit(tmp_path):
  """The ops mode through experiments/bench.py with --base=HEAD: each tree's report, and one report of both."""
  command = [sys.executable, "-m", "experiments.bench", "--what=ops", "--mixers=kda", "--impls=chunk,no_such_impl",
             "--shapes=1x16", "--reps=1", "--set=heads=1", "--set=head_dim=8", "--set=chunk_size=16",
             "--set=breakdown=true", f"--out_dir={tmp_path}", "--tag=trees", "--base=HEAD"]
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
  # The failed impl's rows are in the report, and the exit code says some entries failed (each tree's too).
  assert done.returncode == trees.FAILED_ENTRIES_EXIT, done.stderr[-3000:]
  assert done.stderr.splitlines()[-1].startswith("error: 2 entries of the report failed (kda: ValueError: impl:")
  ours = json.loads(next((tmp_path / "trees_trees" / "this").glob("*_trees.json")).read_text())
  good, bad = ours["results"]
  assert good["error"] is None and 0 < good["fwd_ms"] < 1e5 and 0 < good["fwd_bwd_ms"] < 1e5
  assert 0 < good["fwd_host_ms"] < 1e5 and 0 < good["fwd_bwd_host_ms"] < 1e5  # the second timer, back to back
  assert good["fwd_tokens_per_s"] == pytest.approx(16 / (good["fwd_ms"] * 1e-3))
  assert bad["fwd_ms"] is None and "no_such_impl" in bad["error"]
  assert ours["peer"]["kda fla"] in PEER_ABSENT and ours["timer"].startswith("host wall clock")
  assert good["chunk_size"] == 16 and bad["chunk_size"] == 16
  markdown = next((tmp_path / "trees_trees" / "this").glob("*_trees.md")).read_text()
  assert f"peer kda fla: {ours['peer']['kda fla']}" in markdown and "| kda | chunk | 16 | 1x16 |" in markdown
  assert "breakdown: no kernel list, CUPTI is not available" in markdown and good["kernels_fwd"] is None

  report = json.loads(next(tmp_path.glob("*_trees.json")).read_text())
  assert [(r["tree"], r["impl"]) for r in report["results"]] == [("this", "chunk"), ("this", "no_such_impl"),
                                                                 ("base", "chunk"), ("base", "no_such_impl")]
  this, failed, base, _ = report["results"]
  assert this["vs_base_fwd_ms"] == pytest.approx(base["fwd_ms"] / this["fwd_ms"]) and failed["vs_base_fwd_ms"] is None
  runs = report["runs"]
  assert runs["this"]["package_dir"] == str(ROOT / "sdm_jax") != runs["base"]["package_dir"]
  assert runs["base"]["config"]["peer"] is False and report["trees"]["base"].split()[0] in report["trees"]["this"]
  assert "| kda | chunk | 16 | - | 1 | 16 | base |" in next(tmp_path.glob("*_trees.md")).read_text()
  bad = subprocess.run([sys.executable, "-m", "experiments.bench", "--what=ops", "--base=no_such_commit"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
  assert bad.returncode == 2 and bad.stderr.strip() == (
      f"error: base: expected a commit of the git repository at {ROOT}, got 'no_such_commit'")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_tree_name_names_the_commit_of_a_copy_with_older_history(tmp_path, monkeypatch):
  """A working tree whose files are ahead of its history (the device tool's copy) names the tree hash that the
  commit holding those files has, untracked files included."""
  git = lambda *args: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                                     check=True, capture_output=True, text=True).stdout.strip()
  git("init", "-q")
  (tmp_path / "a.py").write_text("a = 1\n")
  git("add", "a.py")
  git("commit", "-qm", "old")
  monkeypatch.setattr(trees, "ROOT", tmp_path)
  assert trees.tree_name() == git("rev-parse", "--short", "HEAD")
  (tmp_path / "a.py").write_text("a = 2\n")
  (tmp_path / "b.py").write_text("b = 1\n")  # new in the later commit: untracked in the copy
  name = trees.tree_name()
  assert name.startswith(git("rev-parse", "--short", "HEAD") + " with uncommitted changes (tree ")
  assert git("ls-files") == "a.py"  # the repository's own index untouched
  git("add", "-A")
  git("commit", "-qm", "new")
  assert name.endswith(f"(tree {git('rev-parse', 'HEAD^{tree}')[:12]})")
