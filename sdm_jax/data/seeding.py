"""One numpy Generator per (seed, split, example index), so any example can be rebuilt on its own."""

import numpy as np

SPLITS = ("train", "validation")


def check_split(split):
  if split not in SPLITS:
    raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")


def example_rng(seed, split, index):
  """The Generator for example `index` of `split`; the split is part of the key so the streams never overlap."""
  check_split(split)
  if seed < 0 or index < 0:
    raise ValueError(f"seed and index: expected non-negative ints, got seed={seed}, index={index}")
  return np.random.default_rng([int(seed), SPLITS.index(split), int(index)])
