"""Test-wide setup: the repository root on sys.path, a float64 switch for ground-truth runs, and jax's
caches cleared before the process runs out of memory mappings."""

import pathlib
import sys

import jax
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


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
