"""The corpus task: packed rows (segment ids, positions, the loss mask at document boundaries), every in-document
target scored once, iterators restored through JSON, validation sharded by rows, damaged shards named, bits per
byte."""

import collections
import json
import math
import re
import shutil

import grain
import ml_collections
import numpy as np
import pytest

from corpus_helpers import VOCAB
from sdm_jax.data import default_data_config, make_iterator, packing, pipeline, shards


def _documents(lengths):
  """Document d holds d * 1000 + 0, 1, ..., so every token says which document and place it is."""
  return [{"tokens": (1000 * d + np.arange(n)).astype(np.int32)} for d, n in enumerate(lengths)]


def _rows(lengths, seq_len, packing_name, num_bins=1):
  documents = grain.MapDataset.source(_documents(lengths)).to_iter_dataset()
  rows = packing.pack(documents, seq_len=seq_len, packing=packing_name, num_bins=num_bins, seed=0,
                      shuffle_bins=False)
  return [packing.language_model_batch(batch) for batch in rows.batch(4)]


def test_first_fit_rows_carry_segments_positions_and_the_boundary_mask():
  # Rows of 8 tokens, one bin: documents of 3 and 2 tokens share the first row, the next (4) does not fit.
  batch = _rows([3, 2, 4], 7, "first_fit")[0]
  np.testing.assert_array_equal(batch["inputs"], [[0, 1, 2, 1000, 1001, 0, 0], [2000, 2001, 2002, 2003, 0, 0, 0]])
  np.testing.assert_array_equal(batch["targets"][:, :4], [[1, 2, 1000, 1001], [2001, 2002, 2003, 0]])
  np.testing.assert_array_equal(batch["segment_ids"], [[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(batch["positions"], [[0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 0, 0, 0]])
  # The target of a document's last token is the next document's first (or padding): not scored.
  np.testing.assert_array_equal(batch["mask"], [[1, 1, 0, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0]])
  assert {key: value.dtype for key, value in batch.items()} == {
      "inputs": np.int32, "targets": np.int32, "mask": np.float32, "segment_ids": np.int32, "positions": np.int32}


def _scored_pairs(batches):
  pairs = collections.Counter()
  for batch in batches:
    scored = batch["mask"] > 0
    pairs.update(zip(batch["inputs"][scored].tolist(), batch["targets"][scored].tolist()))
  return pairs


@pytest.mark.parametrize("packing_name", packing.PACKINGS)
def test_every_in_document_target_is_scored_once(packing_name):
  lengths = [5, 1, 23, 9, 2, 16, 17, 3, 40, 8]  # rows of 16 + 1 tokens; 23, 40 span rows, 16 fills one exactly
  batches = _rows(lengths, 16, packing_name, num_bins=3)
  expected = collections.Counter((1000 * d + i, 1000 * d + i + 1) for d, n in enumerate(lengths) for i in range(n - 1))
  scored = _scored_pairs(batches)
  if packing_name == "first_fit":
    assert scored == expected  # long documents are cut into pieces that share a token
  else:
    # Every target is in its input's document, each at most once; a document cut between rows loses the one
    # target across the cut.
    assert not scored - expected and max(scored.values()) == 1
    cuts = len(expected) - sum(scored.values())
    assert 1 <= cuts <= len(batches) * 4
  for batch in batches:
    for row_segments, row_positions in zip(batch["segment_ids"], batch["positions"]):
      ids = row_segments[row_segments > 0]
      assert ids[0] == 1 and set(np.diff(ids)) <= {0, 1} and not row_segments[len(ids):].any()
      starts = np.flatnonzero(np.diff(np.concatenate([[0], ids])))
      for start, stop in zip(starts, list(starts[1:]) + [len(ids)]):
        np.testing.assert_array_equal(row_positions[start:stop], np.arange(stop - start))


def test_concat_then_split_restores_through_json_at_a_row_boundary():
  # Documents that fill rows of 6 exactly leave no remainder: grain 0.2.18 keeps the empty slice as a tuple and
  # reads the JSON list back as a remainder, which JsonStateIterDataset converts.
  documents = grain.MapDataset.source(_documents([3, 3, 3, 3, 2, 4, 5, 5, 5, 1, 6])).to_iter_dataset()
  rows = packing.JsonStateIterDataset(packing.pack(documents, seq_len=5, packing="concat_then_split", num_bins=1,
                                                   seed=0, shuffle_bins=False))
  iterator = iter(rows)
  next(iterator)
  state = json.loads(json.dumps(iterator.get_state()))
  expected = [next(iterator)["tokens"].tolist() for _ in range(4)]
  restored = iter(rows)
  restored.set_state(state)
  assert [next(restored)["tokens"].tolist() for _ in range(4)] == expected


def corpus_config(directory, **fields):
  config = ml_collections.ConfigDict()
  config.data = default_data_config("corpus")
  config.data.update({"data_dir": str(directory), "vocab_size": VOCAB, "seq_len": 32, "batch_size": 4, **fields})
  return config


@pytest.mark.parametrize("packing_name", packing.PACKINGS)
@pytest.mark.parametrize("shard_index, shard_count", [(0, 1), (1, 2)])
def test_a_restored_corpus_iterator_continues_with_the_same_batches(tiny_corpus, packing_name, shard_index,
                                                                      shard_count):
  config = corpus_config(tiny_corpus[0], packing=packing_name)
  iterator = make_iterator(config, "train", shard_index=shard_index, shard_count=shard_count)
  first = [next(iterator) for _ in range(5)]
  state = json.loads(json.dumps(iterator.get_state()))
  expected = [next(iterator) for _ in range(3)]
  restored = make_iterator(config, "train", shard_index=shard_index, shard_count=shard_count)
  restored.set_state(state)
  for batch, other in zip(expected, [next(restored) for _ in range(3)]):
    for key in batch:
      np.testing.assert_array_equal(batch[key], other[key])
  assert any(batch["segment_ids"].max() > 1 for batch in first + expected)  # rows do hold several documents


def test_damaged_missing_and_unfinished_corpora_are_named(tiny_corpus, tmp_path):
  directory = tmp_path / "corpus"
  shutil.copytree(tiny_corpus[0], directory)
  config = corpus_config(directory)
  shard = directory / shards.shard_name("train", 2)
  shard.write_bytes(shard.read_bytes()[:1000])
  with pytest.raises(ValueError, match=re.escape(f"corpus shard {str(shard)!r} is damaged: 1000 bytes")):
    make_iterator(config, "train")
  shard.unlink()
  with pytest.raises(ValueError, match=re.escape(f"corpus shard {str(shard)!r} is missing")):
    make_iterator(config, "train")
  manifest = json.loads((directory / shards.MANIFEST).read_text())
  shards.write_json(directory / shards.MANIFEST, {**manifest, "complete": False})
  with pytest.raises(ValueError, match="is incomplete"):
    make_iterator(config, "validation")
  with pytest.raises(ValueError, match="has no manifest.json"):
    make_iterator(corpus_config(tmp_path / "nothing"), "train")
  with pytest.raises(ValueError, match="data.vocab_size: .* needs at least 350, got 256"):
    make_iterator(corpus_config(tiny_corpus[0], vocab_size=256), "train")


def test_bits_per_byte_converts_the_loss_by_targets_per_byte(tiny_corpus):
  config = corpus_config(tiny_corpus[0])
  totals = shards.load_manifest(tiny_corpus[0])["splits"]["validation"]
  targets_per_byte = (totals["tokens"] - totals["documents"]) / totals["bytes"]
  assert 0.1 < targets_per_byte < 1.0
  metrics = pipeline.eval_metrics(config.data, "validation", 2.0 * math.log(2))
  assert metrics == {"bits_per_byte": pytest.approx(2.0 * targets_per_byte)}
  text_config = ml_collections.ConfigDict({"name": "text"})
  assert pipeline.eval_metrics(text_config, "validation", 1.0) == {}


def test_without_document_masks_the_batches_are_the_same_rows_without_segments(tiny_corpus):
  masked = next(make_iterator(corpus_config(tiny_corpus[0]), "train", shard_index=0, shard_count=1))
  plain = next(make_iterator(corpus_config(tiny_corpus[0], document_masks=False), "train", shard_index=0,
                             shard_count=1))
  assert set(masked) - set(plain) == {"segment_ids", "positions"}
  for key in plain:
    np.testing.assert_array_equal(plain[key], masked[key])
