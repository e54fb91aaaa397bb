"""Byte-level language modelling on the CPython standard library's .py sources, which every machine with Python has.

Files are listed in sorted order and assigned to train or validation by a hash of their path relative to the stdlib
root, so the split does not depend on the file system's order or on which other files exist. A split's files are
concatenated with SEPARATOR between them and cut into windows of seq_len + 1 bytes that overlap by one byte, so every
byte after the first is a target exactly once. Nothing is written to disk.
"""

import dataclasses
import os
import pathlib
import sysconfig

import grain
import numpy as np

from sdm_jax.data import task
from sdm_jax.data.seeding import check_split, split_by_hash

# NUL never occurs in Python source text, so it marks a file boundary without being confused with content.
SEPARATOR = 0
VOCAB_SIZE = 256
VALIDATION_FRACTION = 0.05
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def stdlib_root():
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


def list_files(root=None):
  """The sorted .py files under `root` (default: the stdlib), outside installed packages and test directories."""
  root = pathlib.Path(root) if root is not None else stdlib_root()
  files = []
  for directory, subdirs, names in os.walk(root):
    # Pruning in place keeps the walk out of site-packages, which can be far larger than the stdlib itself.
    subdirs[:] = [name for name in subdirs if name not in _SKIPPED_DIRS]
    files += [pathlib.Path(directory, name) for name in names if name.endswith(".py")]
  if not files:
    raise ValueError(f"no .py files found under {root}")
  return sorted(files)


def split_of(relative_path, validation_fraction):
  """The split of a path relative to the root, by a hash of its POSIX form (seeding.split_by_hash)."""
  return split_by_hash(pathlib.PurePath(relative_path).as_posix().encode(), validation_fraction)


def split_files(split, *, validation_fraction=VALIDATION_FRACTION, root=None):
  """The sorted files of `split`."""
  check_split(split)
  root = pathlib.Path(root) if root is not None else stdlib_root()
  return [path for path in list_files(root) if split_of(path.relative_to(root), validation_fraction) == split]


def load_corpus(split, *, validation_fraction=VALIDATION_FRACTION, max_bytes=None, root=None):
  """The bytes of `split`'s files joined by SEPARATOR, as a read-only uint8 array of at most max_bytes bytes.

  Files are read in sorted order and reading stops once max_bytes are gathered, so a small max_bytes reads little.
  """
  if max_bytes is not None and max_bytes < 2:
    raise ValueError(f"max_bytes: expected None (the whole split) or at least 2 bytes, got {max_bytes}")
  pieces, size = [], 0
  for path in split_files(split, validation_fraction=validation_fraction, root=root):
    pieces.append((bytes([SEPARATOR]) if pieces else b"") + path.read_bytes())
    size += len(pieces[-1])
    if max_bytes is not None and size >= max_bytes:
      break
  corpus = np.frombuffer(b"".join(pieces)[:max_bytes], np.uint8)
  if corpus.size < 2:
    raise ValueError(f"the {split} split has fewer than 2 bytes; raise validation_fraction or max_bytes")
  return corpus


class PackedSequences:
  """Random-access windows of a byte corpus: item i is {"inputs", "targets": [T] int32, "mask": [T] float32}."""

  def __init__(self, corpus, seq_len):
    if seq_len < 1 or corpus.size < seq_len + 1:
      raise ValueError(f"seq_len: expected 1 <= seq_len < corpus size {corpus.size}, got {seq_len}")
    self._corpus = corpus
    self._seq_len = seq_len

  def __len__(self):
    return (self._corpus.size - 1) // self._seq_len

  def __getitem__(self, index):
    if not 0 <= index < len(self):
      raise IndexError(f"index {index} out of range for {len(self)} sequences")
    start = index * self._seq_len
    window = self._corpus[start:start + self._seq_len + 1].astype(np.int32)
    return {"inputs": window[:-1], "targets": window[1:], "mask": np.ones(self._seq_len, np.float32)}


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
  """Which bytes of the stdlib a split reads (see split_of and load_corpus); also the text haystack of niah."""
  validation_fraction: float = VALIDATION_FRACTION
  max_bytes: int | None = None

  def load(self, split):
    return load_corpus(split, validation_fraction=self.validation_fraction, max_bytes=self.max_bytes)


@dataclasses.dataclass(frozen=True)
class TextConfig(CorpusConfig):
  """Windows of seq_len + 1 bytes of the corpus; the train windows are reshuffled each epoch from seed."""
  seq_len: int = 1024
  seed: int = 0


def default_config():
  """The task's fields of the data config: the byte vocabulary and TextConfig's defaults."""
  return {"vocab_size": VOCAB_SIZE, **task.defaults(TextConfig)}


def check(data):
  """ValueError unless the data config holds the task's fields (nothing is read)."""
  task.from_data(TextConfig, data)


def examples(data, split):
  """The PackedSequences of `split` as a grain.MapDataset: in order for validation, shuffled and repeated for train."""
  config = task.from_data(TextConfig, data)
  windows = grain.MapDataset.source(PackedSequences(config.load(split), config.seq_len))
  if split == "train":
    # shuffle folds the epoch into its seed (seed + epoch); mixing the seed first keeps seed s + 1 from replaying
    # epoch 1 of seed s.
    shuffle_seed = int(np.random.SeedSequence(config.seed).generate_state(1)[0])
    windows = windows.shuffle(seed=shuffle_seed).repeat()
  return windows
