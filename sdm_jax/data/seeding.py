"""One numpy Generator per (seed, split, example index), so any example can be rebuilt on its own; the split of a
file or document by a hash of its key."""

import hashlib

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


def split_by_hash(key, validation_fraction):
  """The split of `key` (bytes): "validation" when the first 8 bytes of its SHA-256 fall in the lowest
  validation_fraction of their range, else "train". Raising the fraction only moves keys into validation."""
  if not 0.0 < validation_fraction < 1.0:
    raise ValueError(f"validation_fraction: expected a fraction in (0, 1), got {validation_fraction}")
  digest = hashlib.sha256(key).digest()
  return "validation" if int.from_bytes(digest[:8], "little") / 2**64 < validation_fraction else "train"
