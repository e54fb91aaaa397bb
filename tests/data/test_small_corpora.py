"""Small and empty inputs to prepare_data (issue 52): a corpus too small for a split to get a document by its hash
gets the document nearest to that split's part of the hash range, so both splits hold one and a run can train and
evaluate on it; empty inputs and a single document are one clear error; a failed call leaves no directory behind to
refuse the next try, and a directory whose first shard group never finished is started again."""

import hashlib
import json
import re

import ml_collections
import pytest

from sdm_jax.data import default_data_config, make_iterator, prepare, shards
from sdm_jax.training.config import ConfigError, _check_data

TEXTS = ["alpha beta gamma delta epsilon", "the quick brown fox jumps over the lazy dog",
         "lorem ipsum dolor sit amet, consectetur adipiscing elit"]


def write_texts(directory, texts):
  directory.mkdir(parents=True, exist_ok=True)
  for index, text in enumerate(texts):
    (directory / f"doc{index}.txt").write_text(text)
  return str(directory / "*.txt")


def hash_value(text):
  return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def quiet(_):
  pass


@pytest.mark.parametrize("fraction, empty_split, nearest", [(1e-6, "validation", min), (1 - 1e-6, "train", max)])
def test_a_split_no_document_hashes_into_gets_the_nearest_one(tmp_path, fraction, empty_split, nearest):
  lines = []
  manifest = prepare.prepare(write_texts(tmp_path / "in", TEXTS), "train:300", tmp_path / "out",
                             validation_fraction=fraction, log=lines.append)
  chosen = nearest(TEXTS, key=hash_value)
  assert manifest["forced_splits"] == {hashlib.sha256(chosen.encode()).hexdigest(): empty_split}
  assert manifest["splits"][empty_split]["documents"] == 1
  assert manifest["splits"]["train"]["documents"] + manifest["splits"]["validation"]["documents"] == 3
  assert manifest["splits"][empty_split]["bytes"] == len(chosen.encode())
  assert any(line.startswith(f"{empty_split}: no document's hash fell in its part of the split") for line in lines)
  assert shards.load_manifest(tmp_path / "out")["complete"]


def test_a_tiny_corpus_trains_and_evaluates_with_a_batch_that_fits_and_names_one_that_does_not(tmp_path):
  prepare.prepare(write_texts(tmp_path / "in", TEXTS * 1), "train:300", tmp_path / "out", validation_fraction=1e-6,
                  log=quiet)
  config = ml_collections.ConfigDict({"data": default_data_config("corpus")})
  config.data.update(data_dir=str(tmp_path / "out"), vocab_size=300, seq_len=4, batch_size=1)
  _check_data(config.data)
  batch = next(make_iterator(config, "validation"))
  assert batch["inputs"].shape == (1, 4) and batch["mask"].sum() > 0
  config.data.batch_size = 8
  with pytest.raises(ConfigError, match=r"config\.data: corpus validation: \d+ tokens, fewer than one global batch "
                                        r"of 8 rows of 5; lower data.batch_size or data.seq_len"):
    _check_data(config.data)


@pytest.mark.parametrize("inputs, message", [
    ({"a.txt": "", "b.txt": ""}, "the 2 file(s) of {glob!r} are empty; expected text to prepare"),
    ({"a.jsonl": json.dumps({"text": ""}) + "\n"}, "inputs: 1 source(s) hold 0 document(s) with text; a corpus"),
    ({"a.txt": "one document alone"}, "inputs: 1 source(s) hold 1 document(s) with text; a corpus needs at least 2"),
    ({"a.txt": "the same text", "b.txt": "the same text"}, "the 2 documents are one text"),
])
def test_inputs_without_two_documents_are_one_error_and_leave_no_directory(tmp_path, inputs, message):
  (tmp_path / "in").mkdir()
  for name, text in inputs.items():
    (tmp_path / "in" / name).write_text(text)
  glob = str(tmp_path / "in" / "*")
  with pytest.raises(ValueError, match=re.escape(message.format(glob=glob))):
    prepare.prepare(glob, "train:300", tmp_path / "out", log=quiet)
  assert not (tmp_path / "out").exists()


def test_a_failed_call_leaves_nothing_that_refuses_the_next(tmp_path):
  inputs = write_texts(tmp_path / "in", TEXTS)
  with pytest.raises(ValueError, match="tokenizer"):
    prepare.prepare(inputs, str(tmp_path / "no_tokenizer.json"), tmp_path / "out", log=quiet)
  assert not (tmp_path / "out").exists()
  # A directory a killed call left before its first shard group (a manifest, no shard) is started again, whatever
  # flags it was started with.
  (tmp_path / "out").mkdir()
  shards.write_json(tmp_path / "out" / shards.MANIFEST, {
      "format": shards.FORMAT, "complete": False, "fingerprint": "another call's", "finished_groups": [],
      "num_groups": 1, "splits": {"train": {"shards": []}, "validation": {"shards": []}}})
  manifest = prepare.prepare(inputs, "train:300", tmp_path / "out", validation_fraction=0.5, log=quiet)
  assert manifest["complete"] and manifest["validation_fraction"] == 0.5
  # An existing directory is never removed by a failure: it may hold another run's finished groups.
  with pytest.raises(FileExistsError):
    prepare.prepare(inputs, "train:300", tmp_path / "out", log=quiet)
  assert shards.load_manifest(tmp_path / "out")["complete"]


def test_bad_settings_are_refused_before_anything_is_written(tmp_path):
  inputs = write_texts(tmp_path / "in", TEXTS)
  with pytest.raises(ValueError, match=re.escape("validation_fraction: expected a fraction in (0, 1), got 1.5")):
    prepare.prepare(inputs, "train:300", tmp_path / "out", validation_fraction=1.5, log=quiet)
  with pytest.raises(ValueError, match=re.escape("shard_bytes: expected a positive number of bytes, got 0")):
    prepare.prepare(inputs, "train:300", tmp_path / "out", shard_bytes=0, log=quiet)
  assert not (tmp_path / "out").exists()


def test_a_tokenizer_given_by_a_relative_path_is_recorded_absolute(tmp_path, monkeypatch):
  inputs = write_texts(tmp_path / "in", TEXTS)
  prepare.prepare(inputs, "train:300", tmp_path / "first", log=quiet)
  monkeypatch.chdir(tmp_path)
  manifest = prepare.prepare(inputs, "first/tokenizer.json", "second", log=quiet)
  assert manifest["tokenizer"]["source"] == str(tmp_path / "first" / "tokenizer.json")
