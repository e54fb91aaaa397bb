"""Timing a mode of the registry in another tree beside this one (`bench --base=<commit>`), as fla's benchmark
runner does (fla's ops runner, `run.py`, copies the runner beside each commit's package): the commit is written to a
temporary directory (`git archive`) and this tree's harness (`HARNESS`) is laid over it, so both trees are timed by
the same code and only the code under it differs. Each tree runs in a process of its own, one after the other, so
each has the device to itself (this process never starts JAX's backend); their reports stay under
<out_dir>/<tag>_trees/{this,base}/, and one report holds both trees' rows with a `tree` column and, for each of the
mode's lower-is-better numbers (`Mode.compared`), vs base = base / this (above 1: this tree is faster or smaller).
"""

import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

from sdm_jax.benchmarking.settings import as_text
from sdm_jax.benchmarking.tables import Column, table, write_tables
from sdm_jax.training.config import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What a --base run takes from this tree: the measuring code, the inputs it draws, and its command line.
HARNESS = ("sdm_jax/benchmarking", "sdm_jax/testing", "experiments/__init__.py", "experiments/cli.py",
           "experiments/bench.py")
TREES = ("this", "base")
# experiments.bench's exit code when it wrote its report but some entries hold an error: a tree's run with failed
# entries still gives its rows to a comparison of trees.
FAILED_ENTRIES_EXIT = 3


def _git(*args, env=None):
  done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                        env=None if env is None else {**os.environ, **env})
  return done.stdout.strip() if done.returncode == 0 else None


def tree_name():
  """This tree, as its commit and whether it has uncommitted changes to tracked files. With changes, also the git
  tree hash of the files as they are (untracked ones not ignored included, through a scratch index): a copy of a
  working tree whose history is older than its files (the device tool's) then still names the commit whose tree it
  is (`git rev-parse <commit>^{tree}` prints the same hash)."""
  head = _git("rev-parse", "--short", "HEAD") or "?"
  if not _git("status", "--porcelain", "--untracked-files=no"):
    return head
  with tempfile.TemporaryDirectory() as scratch:
    env = {"GIT_INDEX_FILE": os.path.join(scratch, "index")}
    ok = _git("read-tree", "HEAD", env=env) is not None and _git("add", "-A", env=env) is not None
    tree = _git("write-tree", env=env) if ok else None
  return f"{head} with uncommitted changes" + (f" (tree {tree[:12]})" if tree else "")


def materialise(commit, dest):
  """Writes the tree of `commit` into dest (`git archive`) with this tree's HARNESS laid over it; returns
  '<short hash> <subject>' of the commit."""
  full = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
  if not full:
    raise ConfigError(f"base: expected a commit of the git repository at {ROOT}, got {commit!r}")
  with subprocess.Popen(["git", "archive", "--format=tar", full], cwd=ROOT, stdout=subprocess.PIPE) as archive:
    with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
      tar.extractall(dest, filter="data")
  if archive.returncode:
    raise RuntimeError(f"git archive {full} failed with exit code {archive.returncode}")
  for path in HARNESS:
    source, target = ROOT / path, pathlib.Path(dest) / path
    if source.is_dir():
      shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    else:
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(source, target)
  return _git("log", "-1", "--format=%h %<(60,trunc)%s", full).strip()


def _run_tree(tree, root, what, overrides, out_dir, tag, log):
  """Runs `python -m experiments.bench` for one tree in a process of its own; returns its report's JSON."""
  command = [sys.executable, "-m", "experiments.bench", f"--what={what}", f"--out_dir={out_dir}", f"--tag={tag}",
             *[f"--set={item}" for item in overrides]]
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
  log(f"== {tree} tree ({root}): {' '.join(command[1:])}")
  done = subprocess.run(command, cwd=root, env=env)
  reports = sorted(glob.glob(os.path.join(out_dir, f"*_{tag}.json")), key=os.path.getmtime)
  if done.returncode not in (0, FAILED_ENTRIES_EXIT) or not reports:
    why = f"exited with code {done.returncode}" if done.returncode else f"wrote no report to {out_dir}"
    raise RuntimeError(f"base: the {tree} tree's run {why}; its output is above")
  with open(reports[-1]) as f:
    return json.load(f)


def link_trees(records, entry):
  """Sets vs_base_<field> = base / this on each of this tree's records whose point the base tree also measured."""
  key = lambda r: tuple(json.dumps(r.get(k), sort_keys=True) for k in entry.key)
  base = {key(r): r for r in records if r["tree"] == "base"}
  for r in records:
    if r["tree"] != "this":
      continue
    other = base.get(key(r), {})
    for field in entry.compared:
      ours, theirs = r.get(field), other.get(field)
      r[f"vs_base_{field}"] = theirs / ours if ours and theirs else None


def compare_table(records, entry):
  """A markdown table of both trees' records: the key, the tree, the compared numbers and this tree's ratios."""
  columns = [Column(name, name) for name in (*entry.key, "tree", *entry.compared)]
  columns += [Column(f"vs base {field}", f"vs_base_{field}", ".2f", suffix="x") for field in entry.compared]
  return table(columns + [Column("note", lambda r: str(r.get("error") or ""))], records)


def compare_trees(entry, overrides, base, *, out_dir, tag, log=print):
  """Times the registry's mode `entry` (a `registry.Mode`) in this tree and in commit `base`, each in a process of
  its own, and writes one report of both (the module docstring); returns its paths."""
  from sdm_jax.benchmarking.timing import command_line
  what = entry.name
  trees = {"this": tree_name()}
  runs = {}
  scratch = tempfile.mkdtemp(prefix="sdm_jax_base_")
  try:
    trees["base"] = materialise(base, scratch)
    extra = {"this": [], "base": [f"{name}={as_text(value)}" for name, value in entry.base_settings.items()]}
    for tree, root in (("this", ROOT), ("base", pathlib.Path(scratch))):
      tree_dir = os.path.abspath(os.path.join(out_dir, f"{tag}_trees", tree))
      runs[tree] = _run_tree(tree, root, what, [*overrides, *extra[tree]], tree_dir, tag, log)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  # Each tree's rows in its own order, this tree's first: the pairs are read off the key columns.
  records = [{**r, "tree": tree} for tree in TREES for r in runs[tree]["results"]]
  link_trees(records, entry)
  meta = {k: v for k, v in runs["this"].items() if k != "results"}
  meta["command"] = command_line()
  meta["trees"] = trees
  meta["runs"] = {tree: {k: v for k, v in run.items() if k != "results"} for tree, run in runs.items()}
  notes = [f"- this: {trees['this']}; base: {trees['base']} (this tree's harness, {', '.join(HARNESS)}, over it)",
           f"- vs base = base / this (above 1: this tree is faster or smaller); each tree's own report: "
           f"{os.path.join(out_dir, tag + '_trees', '{this,base}')}"]
  notes += [f"- base run's settings beside this one's: {', '.join(extra['base'])}"] if extra["base"] else []
  notes += [f"- peer for {name}: {note}" for name, note in meta.get("peer", {}).items()]
  paths = write_tables(records, meta, out_dir, tag, f"{what}, this tree against {base}", notes,
                       compare_table(records, entry))
  log("\nwrote " + ", ".join(paths[ext] for ext in ("json", "md")) + "\n" + compare_table(records, entry))
  return {ext: paths[ext] for ext in ("json", "md")}
