"""Preparing a corpus: records decode back to their documents, the manifest counts what the shards hold, a stopped
run resumes to the same result, a complete directory is not overwritten; tokenizers and inputs fail by name."""

import collections
import importlib.util
import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from array_record.python import array_record_module

from experiments import cli
from corpus_helpers import SHARD_BYTES, VALIDATION_FRACTION, VOCAB, write_inputs
from sdm_jax.data import documents, prepare, shards, tokenizer
from sdm_jax.data.seeding import split_by_hash

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _records(directory, shard, dtype):
  reader = array_record_module.ArrayRecordReader(str(directory / shard["path"]))
  records = [shards.decode_document(record, dtype) for record in reader.read_all()]
  reader.close()
  return records


def test_records_decode_to_their_documents_and_the_manifest_counts_them(tiny_corpus):
  directory, _, texts = tiny_corpus
  manifest = shards.load_manifest(directory)
  bpe = tokenizer.load_tokenizer(directory / "tokenizer.json")
  eos = manifest["tokenizer"]["eos_id"]
  assert manifest["tokenizer"]["vocab_size"] == VOCAB and bpe.id_to_token(eos) == tokenizer.TRAINED_EOS
  assert manifest["token_dtype"] == "uint16" and manifest["num_groups"] == 3
  found = collections.Counter()
  for split in ("train", "validation"):
    totals = collections.Counter()
    for shard in manifest["splits"][split]["shards"]:
      records = _records(directory, shard, manifest["token_dtype"])
      decoded = [bpe.decode(record[:-1].tolist()) for record in records]
      assert all(record[-1] == eos and eos not in record[:-1] for record in records)
      assert all(split_by_hash(text.encode(), VALIDATION_FRACTION) == split for text in decoded)
      assert (shard["documents"], shard["tokens"], shard["bytes"]) == (
          len(records), sum(map(len, records)), sum(len(text.encode()) for text in decoded))
      totals.update(documents=len(records), tokens=sum(map(len, records)))
      found.update(decoded)
    assert totals["documents"] == manifest["splits"][split]["documents"] > 0
    assert totals["tokens"] == manifest["splits"][split]["tokens"]
  assert found == collections.Counter(texts)


def _interrupt_after(lines):
  """A log that raises at its `lines`-th progress line, as a run killed right after a shard group would stop."""
  def log(line):
    if line.startswith("["):
      log.count += 1
      if log.count == lines:
        raise KeyboardInterrupt
  log.count = 0
  return log


def test_a_stopped_run_resumes_to_the_same_corpus(tiny_corpus, tmp_path):
  directory, inputs, _ = tiny_corpus
  out = tmp_path / "out"
  with pytest.raises(KeyboardInterrupt):
    prepare.prepare(inputs, f"train:{VOCAB}", out, validation_fraction=VALIDATION_FRACTION, shard_bytes=SHARD_BYTES,
                    log=_interrupt_after(2))
  with pytest.raises(ValueError, match="incomplete .2 of 3 shard groups"):
    shards.load_manifest(out)
  # Group 1 was recorded as finished, but its shard is gone: it is written again, group 0 is not.
  (out / shards.shard_name("train", 1)).unlink()
  lines = []
  manifest = prepare.prepare(inputs, f"train:{VOCAB}", out, validation_fraction=VALIDATION_FRACTION, shard_bytes=SHARD_BYTES,
                             log=lines.append)
  assert [line for line in lines if "skipped" in line] == ["[1/3] shard group 0: written by an earlier run, skipped"]
  assert "trained by the run being resumed" in lines[1]
  expected = shards.load_manifest(directory)
  assert manifest["splits"] == expected["splits"] and manifest["tokenizer"] == expected["tokenizer"]
  for shard in expected["splits"]["train"]["shards"]:
    assert (out / shard["path"]).read_bytes() == (directory / shard["path"]).read_bytes()
  with pytest.raises(FileExistsError, match="already holds a complete corpus"):
    prepare.prepare(inputs, f"train:{VOCAB}", out, validation_fraction=VALIDATION_FRACTION, shard_bytes=SHARD_BYTES)


def test_a_resumed_run_must_keep_its_settings(tiny_corpus, tmp_path):
  _, inputs, _ = tiny_corpus
  with pytest.raises(KeyboardInterrupt):
    prepare.prepare(inputs, f"train:{VOCAB}", tmp_path, validation_fraction=VALIDATION_FRACTION, shard_bytes=SHARD_BYTES,
                    log=_interrupt_after(1))
  with pytest.raises(ValueError, match="other inputs, tokenizer or settings"):
    prepare.prepare(inputs, f"train:{VOCAB}", tmp_path, validation_fraction=0.5, shard_bytes=SHARD_BYTES, log=lambda _: None)


def test_a_tokenizer_from_a_path_gives_the_same_ids(tiny_corpus, tmp_path):
  directory, inputs, _ = tiny_corpus
  manifest = prepare.prepare(inputs, str(directory / "tokenizer.json"), tmp_path, shard_bytes=10**6,
                             validation_fraction=VALIDATION_FRACTION, log=lambda _: None)
  assert manifest["num_groups"] == 1 and (tmp_path / "tokenizer.json").is_file()
  expected = shards.load_manifest(directory)
  assert manifest["tokenizer"]["sha256"] == expected["tokenizer"]["sha256"]
  for split in ("train", "validation"):
    got = [record.tolist() for shard in manifest["splits"][split]["shards"]
           for record in _records(tmp_path, shard, "uint16")]
    want = [record.tolist() for shard in expected["splits"][split]["shards"]
            for record in _records(directory, shard, "uint16")]
    assert got == want


def test_bad_tokenizers_are_named(tmp_path):
  missing = tmp_path / "nowhere" / "tokenizer.json"
  with pytest.raises(ValueError, match=re.escape(f"{str(missing)!r} is not a file")):
    tokenizer.load_tokenizer(missing)
  garbage = tmp_path / "tokenizer.json"
  garbage.write_text('{"version": "1.0", "model": 3}')
  with pytest.raises(ValueError, match=re.escape(f"{str(garbage)!r} is not a readable tokenizer.json")):
    tokenizer.load_tokenizer(garbage)
  with pytest.raises(ValueError, match="expected a tokenizer.json path or 'train:VOCAB'"):
    prepare.prepare(["pydoc"], "train:many", tmp_path / "out")
  with pytest.raises(ValueError, match="vocab_size: expected at least 257"):
    tokenizer.train_tokenizer(["some text"], 200, tmp_path / "small.json")


def test_eos_is_found_or_named(tmp_path):
  bpe = tokenizer.train_tokenizer(["a b c"] * 4, 260, tmp_path / "t.json")
  assert tokenizer.eos_id(bpe) == bpe.token_to_id("<|endoftext|>") == 0
  size = tokenizer.vocab_size(bpe)  # 257 and the merges that "a b c" allows
  bpe.add_special_tokens(["</s>"])
  assert tokenizer.eos_id(bpe, "</s>") == size and tokenizer.vocab_size(bpe) == size + 1
  with pytest.raises(ValueError, match=re.escape("none of ('<|im_end|>',)")):
    tokenizer.eos_id(bpe, "<|im_end|>")


def test_inputs_are_checked_by_name(tmp_path):
  with pytest.raises(ValueError, match=re.escape(f"{str(tmp_path / '*.txt')!r} matches no file")):
    documents.expand_inputs(str(tmp_path / "*.txt"))
  (tmp_path / "table.csv").write_text("text\nhello\n")
  with pytest.raises(ValueError, match="table.csv.*expected a file ending in one of"):
    documents.expand_inputs(str(tmp_path / "*.csv"))
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "fine"}\n\n{"body": "no text field"}\n')
  with pytest.raises(ValueError, match=re.escape(f"{bad}:3: expected an object with a string 'text' field")):
    list(documents.read_documents(str(bad)))
  (tmp_path / "table.parquet").write_bytes(b"PAR1")
  if importlib.util.find_spec("pyarrow") is None:
    with pytest.raises(ValueError, match="table.parquet.*needs pyarrow"):
      documents.expand_inputs(str(tmp_path / "*.parquet"))
  sources = documents.expand_inputs(f"pydoc,{tmp_path / 'bad.jsonl'},pydoc")
  assert sources == sorted({documents.PYDOC_SOURCE, str(bad.resolve())})
  topics = list(documents.read_documents(documents.PYDOC_SOURCE))
  assert len(topics) > 50 and any("for_stmt" in topic or "The for statement" in topic for topic in topics)


def test_the_command_line_prepares_and_refuses_to_overwrite(tiny_corpus, tmp_path):
  directory, _, texts = tiny_corpus
  inputs = write_inputs(tmp_path / "inputs", texts[:12])
  command = [sys.executable, "-m", "experiments.prepare_data", f"--inputs={','.join(inputs)}",
             f"--tokenizer={directory / 'tokenizer.json'}", f"--out={tmp_path / 'out'}", "--validation_fraction=0.25"]
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0 and "done:" in done.stdout, done.stderr[-2000:]
  splits = shards.load_manifest(tmp_path / "out")["splits"]
  assert splits["train"]["documents"] + splits["validation"]["documents"] == 12
  again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert again.returncode == cli.USAGE_EXIT and "already holds a complete corpus" in again.stderr
  assert "Traceback" not in again.stderr


def test_text_codec_of_a_run(tiny_corpus, tmp_path):
  """What experiments.generate prompts and decodes with: the corpus's own tokenizer, bytes for byte-level tasks."""
  directory, _, documents = tiny_corpus
  encode, decode = tokenizer.text_codec({"name": "corpus", "data_dir": str(directory)})
  text = "def main(x):\n    return x"
  ids = encode(text)
  assert ids == tokenizer.load_tokenizer(directory / "tokenizer.json").encode(text).ids and decode(ids) == text
  encode, decode = tokenizer.text_codec({"name": "text"})
  assert encode("é!") == [195, 169, 33] and decode([195, 169, 33, 300]) == "é!\ufffd"
  assert tokenizer.text_codec({"name": "mqar"}) is None
  with pytest.raises(ValueError, match="tokenizer"):
    tokenizer.text_codec({"name": "corpus", "data_dir": str(tmp_path)})
