"""A tiny prepared corpus shared by the data tests: synthetic documents in .txt and .jsonl files, a 350-token BPE."""

import pytest

from corpus_helpers import SHARD_BYTES, VALIDATION_FRACTION, VOCAB, synthetic_documents, write_inputs
from sdm_jax.data import prepare


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
  """(corpus directory, inputs, documents): prepared with train:VOCAB in three shard groups."""
  root = tmp_path_factory.mktemp("tiny_corpus")
  documents = synthetic_documents()
  inputs = write_inputs(root / "inputs", documents)
  prepare.prepare(inputs, f"train:{VOCAB}", root / "corpus", validation_fraction=VALIDATION_FRACTION, shard_bytes=SHARD_BYTES,
                  log=lambda _: None)
  return root / "corpus", inputs, documents
