"""The documents of a corpus's inputs: text files, JSON lines, Parquet tables, and the machine's own Python.

An input is a glob of .txt / .py / .jsonl / .parquet files or a name. A .txt or .py file is one document; a .jsonl
file has one document per line, its "text" field; a .parquet file one per row of its "text" column (read with
pyarrow, which is optional). STDLIB is the offline default corpus: the CPython standard library's .py files
(sdm_jax.data.text.list_files), each one document, and its reference documentation (pydoc_data.topics, the text
of `help()`), one document per topic. PYDOC names the topics alone.

Inputs expand to sources, sorted and unique: absolute file paths, and PYDOC_SOURCE for the topics.
"""

import glob
import importlib.util
import json
import pathlib

from sdm_jax.data import text

STDLIB = "stdlib"
PYDOC = "pydoc"
PYDOC_SOURCE = "pydoc_data.topics"
EXTENSIONS = (".txt", ".py", ".jsonl", ".parquet")
TEXT_FIELD = "text"


def _pydoc_topics():
  import pydoc_data.topics
  return pydoc_data.topics.topics


def expand_inputs(inputs):
  """The sorted unique sources of `inputs` (a list of globs and names, or one comma-separated string)."""
  if isinstance(inputs, str):
    inputs = [item for item in inputs.split(",") if item.strip()]
  if not inputs:
    raise ValueError(f"inputs: expected globs of {EXTENSIONS} files, {STDLIB!r} or {PYDOC!r}, got none")
  sources = set()
  for item in (item.strip() for item in inputs):
    if item == STDLIB:
      sources.update(str(path) for path in text.list_files())
      sources.add(PYDOC_SOURCE)
    elif item == PYDOC:
      sources.add(PYDOC_SOURCE)
    else:
      matches = [pathlib.Path(match) for match in glob.glob(item, recursive=True)]
      files = [path for path in matches if path.is_file()]
      if not files:
        raise ValueError(f"inputs: {item!r} matches no file")
      for path in files:
        if path.suffix not in EXTENSIONS:
          raise ValueError(f"inputs: {str(path)!r} (from {item!r}): expected a file ending in one of {EXTENSIONS}")
        sources.add(str(path.resolve()))
  sources = sorted(sources)
  if any(source.endswith(".parquet") for source in sources) and importlib.util.find_spec("pyarrow") is None:
    parquet = next(source for source in sources if source.endswith(".parquet"))
    raise ValueError(f"inputs: reading .parquet files ({parquet!r}) needs pyarrow, which is not installed "
                     f"(pip install pyarrow)")
  return sources


def source_size(source):
  """The bytes of text a source holds (its file size; the topics' UTF-8 length), what shards are balanced by."""
  if source == PYDOC_SOURCE:
    return sum(len(topic.encode()) for topic in _pydoc_topics().values())
  return pathlib.Path(source).stat().st_size


def _decode(path, data):
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as error:
    raise ValueError(f"{path}: not UTF-8 text ({error})") from error


def read_documents(source):
  """Yields the documents (non-empty strings) of one source, in its order."""
  if source == PYDOC_SOURCE:
    topics = _pydoc_topics()
    documents = (topics[name] for name in sorted(topics))
  elif source.endswith(".jsonl"):
    documents = _jsonl_documents(source)
  elif source.endswith(".parquet"):
    documents = _parquet_documents(source)
  else:  # a .txt or .py file
    documents = [_decode(source, pathlib.Path(source).read_bytes())]
  for document in documents:
    if document:
      yield document


def _jsonl_documents(path):
  with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(_decode(f"{path}:{number}", line))
      except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{number}: not a JSON line ({error})") from error
      if not isinstance(record, dict) or not isinstance(record.get(TEXT_FIELD), str):
        raise ValueError(f"{path}:{number}: expected an object with a string {TEXT_FIELD!r} field")
      yield record[TEXT_FIELD]


def _parquet_documents(path):
  import pyarrow.parquet as pq  # checked by expand_inputs
  parquet = pq.ParquetFile(path)
  if TEXT_FIELD not in parquet.schema_arrow.names:
    raise ValueError(f"{path}: no {TEXT_FIELD!r} column (columns: {parquet.schema_arrow.names})")
  for batch in parquet.iter_batches(columns=[TEXT_FIELD]):
    for document in batch.column(0).to_pylist():
      if document is not None:
        yield document
