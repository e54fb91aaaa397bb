"""The on-disk form of a pre-tokenized corpus (written by sdm_jax.data.prepare, read by sdm_jax.data.corpus).

A corpus directory holds

    manifest.json                 what the shards hold (below); "complete" once every shard is written
    tokenizer.json                the tokenizer the ids come from
    train-00000.array_record      ArrayRecord shards, one record per document: its token ids and then the
    validation-00000.array_record end-of-document id, little-endian TOKEN_DTYPES[manifest["token_dtype"]]

The manifest: {"format", "complete", "tokenizer": {"path", "sha256", "source", "vocab_size", "eos_id",
"eos_token"}, "token_dtype", "sources", "validation_fraction", "shard_bytes", "fingerprint", "num_groups",
"finished_groups", "splits": {split: {"shards": [{"path", "group", "documents", "tokens", "bytes",
"file_bytes"}], "documents", "tokens", "bytes", "tokens_per_byte"}}}. "tokens" counts ids with the
end-of-document ones, "bytes" the UTF-8 bytes of the documents' text (tokens_per_byte is their ratio, a measure of
the tokenizer; bits per byte divides by the targets, tokens - documents, see sdm_jax.data.corpus). Paths are
relative to the directory.
"""

import json
import os
import pathlib

import numpy as np
from array_record.python import array_record_module

FORMAT = 1
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
# One record per group: documents are read one at a time, in any order (ArrayRecord's random-access setting).
WRITER_OPTIONS = "group_size:1"


def token_dtype(vocab_size):
  """The narrowest TOKEN_DTYPES name that holds ids below vocab_size."""
  return "uint16" if vocab_size <= 2**16 else "uint32"


def shard_name(split, group):
  return f"{split}-{group:05d}.array_record"


def encode_document(ids, eos_id, dtype):
  """A document's ids and the end-of-document id as one record (bytes)."""
  return np.append(np.asarray(ids, np.int64), eos_id).astype(TOKEN_DTYPES[dtype]).tobytes()


def decode_document(record, dtype):
  """A record -> its ids as an int32 array [n]."""
  return np.frombuffer(record, TOKEN_DTYPES[dtype]).astype(np.int32)


def write_json(path, value):
  """Writes `value` so that a reader sees the old file or the new one, never part of one."""
  path = pathlib.Path(path)
  partial = path.with_name(path.name + ".partial")
  partial.write_text(json.dumps(value, indent=1))
  os.replace(partial, path)


def read_manifest(directory):
  """The manifest of a corpus directory, complete or not; None when there is none."""
  path = pathlib.Path(directory) / MANIFEST
  if not path.exists():
    return None
  try:
    manifest = json.loads(path.read_text())
  except json.JSONDecodeError as error:
    raise ValueError(f"corpus manifest {path}: not JSON ({error})") from error
  if manifest.get("format") != FORMAT:
    raise ValueError(f"corpus manifest {path}: format {manifest.get('format')!r}, expected {FORMAT}")
  return manifest


def load_manifest(directory):
  """The manifest of a complete corpus directory; ValueError naming what is missing or unfinished."""
  directory = pathlib.Path(directory)
  manifest = read_manifest(directory)
  if manifest is None:
    raise ValueError(f"corpus directory {str(directory)!r} has no {MANIFEST}; prepare it with "
                     f"`python -m experiments.prepare_data --out={directory}`")
  if not manifest["complete"]:
    raise ValueError(f"corpus directory {str(directory)!r} is incomplete ({len(manifest['finished_groups'])} of "
                     f"{manifest['num_groups']} shard groups written); run experiments.prepare_data again with the "
                     f"same flags to finish it")
  return manifest


def check_shard(directory, shard):
  """Raises ValueError naming the shard file unless it exists with the size and record count the manifest
  records (a truncated ArrayRecord file opens with fewer records, or none, rather than failing)."""
  path = pathlib.Path(directory) / shard["path"]
  if not path.is_file():
    raise ValueError(f"corpus shard {str(path)!r} is missing (the manifest lists {shard['documents']} documents "
                     f"in it); prepare the corpus again")
  size = path.stat().st_size
  if size != shard["file_bytes"]:
    raise ValueError(f"corpus shard {str(path)!r} is damaged: {size} bytes, the manifest records "
                     f"{shard['file_bytes']}; prepare the corpus again")
  try:
    reader = array_record_module.ArrayRecordReader(str(path))
    count = reader.num_records()
    reader.close()
  except Exception as error:  # the reader raises bare RuntimeErrors
    raise ValueError(f"corpus shard {str(path)!r} is damaged: unreadable ({type(error).__name__}: {error})") from error
  if count != shard["documents"]:
    raise ValueError(f"corpus shard {str(path)!r} is damaged: {count} records, the manifest records "
                     f"{shard['documents']}; prepare the corpus again")


def split_paths(directory, split, manifest=None):
  """The shard files of `split` of a complete corpus, each checked against the manifest."""
  manifest = manifest or load_manifest(directory)
  shards = manifest["splits"][split]["shards"]
  if not shards:
    raise ValueError(f"corpus directory {str(directory)!r}: the {split} split has no documents")
  for shard in shards:
    check_shard(directory, shard)
  return [str(pathlib.Path(directory) / shard["path"]) for shard in shards]
