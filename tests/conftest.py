"""Test-wide setup: the repository root on sys.path, one persistent compilation cache for the whole run, LLVM's
optimisations off, a float64 switch for ground-truth runs, and jax's caches cleared before the process runs out of
memory mappings."""

import os
import pathlib
import shutil
import sys
import tempfile

# Many tests compile the same programs (the tiny training configs, the command-line runs in subprocesses): one
# compilation cache, made by the first process of a run and inherited by the xdist workers and every subprocess
# through the environment, compiles each once. A fresh directory per run, removed at the end.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="sdm_jax_tests_jax_cache_")
# The tests' programs are tiny and compiled once each, so compiling dominates: LLVM's optimisations (not XLA's
# HLO passes) cost more than they save here, about 15 % of a test's time. Only the CPU backend reads the flag.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import jax  # noqa: E402  (after the cache directory is in the environment)
import pytest  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
# The command-line runs in subprocesses each build a model and restore checkpoints through dozens of small programs
# that the cache's default 1 s threshold would compile again in every process: their processes cache every program
# (set after jax's import, so this process keeps the default and writes only its long compilations).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def pytest_unconfigure(config):
  if _OWN_CACHE:
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


@pytest.fixture
def x64():
  """Enables jax_enable_x64 for one test and restores the previous setting afterwards."""
  previous = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", previous)


def _mapping_count():
  """Memory mappings of this process (Linux; 0 where /proc is missing)."""
  try:
    with open("/proc/self/maps") as f:
      return sum(1 for _ in f)
  except OSError:
    return 0


def _mapping_limit():
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read())
  except (OSError, ValueError):
    return 65530


@pytest.fixture(autouse=True)
def _release_compiled_programs():
  """Drops jax's compiled programs once this process holds half the mappings Linux allows. Every CPU
  executable keeps its own mappings, about 430 per interpret-mode delta-rule test; one process running
  ~150 such tests passed vm.max_map_count (65,530 here) and XLA's compiler segfaulted (a serial run of
  the pallas sweep). Clearing after every test instead made `make test` 20% slower."""
  yield
  if _mapping_count() > _mapping_limit() // 2:
    jax.clear_caches()
