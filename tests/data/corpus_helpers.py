"""Synthetic documents for the corpus tests, written as .txt and .jsonl inputs."""

import json

import numpy as np

WORDS = ("the delta rule writes a value under its key and erases what the key held before so a state of fixed size "
         "keeps the most recent association of every key while old ones decay").split()
VALIDATION_FRACTION = 0.25
SHARD_BYTES = 800  # three shard groups: two of .txt files, the .jsonl file
VOCAB = 350  # most words one token (every word is one at 366, where the trainer runs out of merges)


def synthetic_documents(count=48, seed=0):
  """`count` documents of 2 to 80 words (some longer than a test row, some several to a row)."""
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 80)))) + "." for _ in range(count)]


def write_inputs(directory, documents):
  """The first 8 documents as .txt files, the rest as lines of one .jsonl file; returns the inputs' globs."""
  directory.mkdir(parents=True, exist_ok=True)
  for index, document in enumerate(documents[:8]):
    (directory / f"doc{index}.txt").write_text(document)
  with open(directory / "rest.jsonl", "w") as f:
    for document in documents[8:]:
      f.write(json.dumps({"text": document, "id": len(document)}) + "\n")
  return [str(directory / "*.txt"), str(directory / "*.jsonl")]
