"""The stdlib byte corpus: a file-level split that is disjoint and stable, and exact packing into windows."""

import numpy as np
import pytest

from sdm_jax.data import text


def test_listing_skips_installed_packages_and_tests(tmp_path):
  for relative in ("a.py", "pkg/b.py", "pkg/notes.txt", "test/test_a.py", "pkg/tests/c.py", "site-packages/d.py",
                   "idlelib/idle_test/e.py"):
    (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / relative).write_text(f"# {relative}\n")
  assert [p.relative_to(tmp_path).as_posix() for p in text.list_files(tmp_path)] == ["a.py", "pkg/b.py"]


def test_stdlib_split_is_disjoint_complete_and_stable():
  root = text.stdlib_root()
  every = text.list_files()
  train = text.split_files("train")
  validation = text.split_files("validation")
  assert not set(train) & set(validation)
  assert sorted(train + validation) == every == sorted(every)
  assert 0.01 < len(validation) / len(every) < 0.15
  assert not any({"site-packages", "test", "tests"} & set(p.relative_to(root).parts) for p in every)
  # Pinned: the split is a function of the relative path alone, so these hold on any machine's stdlib.
  assert [text.split_of(p, 0.05) for p in ("bisect.py", "weakref.py", "json/decoder.py", "os.py")] == [
      "validation", "validation", "train", "train"]
  assert set(validation) < set(text.split_files("validation", validation_fraction=0.2))


def test_corpus_joins_files_with_the_separator():
  files = text.split_files("validation")
  corpus = text.load_corpus("validation", max_bytes=150_000)
  assert corpus.dtype == np.uint8 and corpus.size == 150_000 and not corpus.flags.writeable
  documents = corpus.tobytes().split(bytes([text.SEPARATOR]))
  assert len(documents) > 1
  for path, document in zip(files, documents[:-1]):
    assert document == path.read_bytes()
  assert files[len(documents) - 1].read_bytes().startswith(documents[-1])


def test_packing_makes_every_byte_a_target_once():
  corpus = np.frombuffer(bytes(range(256)) * 3 + b"tail", np.uint8)
  sequences = text.PackedSequences(corpus, 100)
  assert len(sequences) == (corpus.size - 1) // 100 == 7
  items = [sequences[i] for i in range(len(sequences))]
  for i, item in enumerate(items):
    assert item["inputs"].shape == item["targets"].shape == item["mask"].shape == (100,)
    assert item["inputs"].dtype == np.int32 and item["mask"].dtype == np.float32 and item["mask"].all()
    np.testing.assert_array_equal(item["inputs"], corpus[100 * i:100 * i + 100])
    np.testing.assert_array_equal(item["targets"], corpus[100 * i + 1:100 * i + 101])
  np.testing.assert_array_equal(np.concatenate([item["targets"] for item in items]), corpus[1:701])
  with pytest.raises(IndexError):
    sequences[7]
  with pytest.raises(ValueError, match="seq_len"):
    text.PackedSequences(corpus, corpus.size)
