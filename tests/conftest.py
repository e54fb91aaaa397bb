"""Test-wide setup: the repository root on sys.path and a float64 switch for ground-truth runs."""

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
