"""What a data task is, and the helpers the tasks share.

A task is a module (or any object) registered by name in pipeline.TASKS that provides

    default_config() -> dict: its own fields of the `data` ConfigDict with their defaults, beside the common fields
        (name, seed, batch_size, num_threads, prefetch_buffer_size) that pipeline.default_data_config sets;
    examples(data, split) -> grain.MapDataset of unbatched examples
        {"inputs": [T] int32, "targets": [T] int32, "mask": [T] float32} with T = data.seq_len; the train split is
        infinite (len sys.maxsize), the validation split finite;

or, instead of examples, for a task whose rows are not single examples (documents packed into rows),
    batches(data, split, *, shard_index, shard_count, read_options) -> grain.IterDataset of shard shard_index's
        batches of data.batch_size // shard_count rows, with at least the keys above ([B, T]); the shards' n-th
        batches concatenate in shard order to the n-th batch of shard_count=1, and every shard's iterator holds the
        same state at the same batch (pipeline.py: what a global batch and a checkpoint of several hosts rely on);
and optionally
    check(data) -> None: ValueError naming the field ("num_queries: ...") unless the fields work together; cheap
        (no example is made, no data file read beyond a manifest), so that a config is refused before a run starts;
    PATH_FIELDS: the names of its fields that hold paths (made absolute when a run starts);
    eval_metrics(data, split, loss) -> dict of metrics derived from a mean evaluation loss (bits per byte).
A task whose stored data turns out unreadable while it is read (a damaged shard) raises DataError naming the file.

A task's defaults live once, in its config dataclass; default_config() reads them with `defaults` and examples()
reads the config back from `data` with `from_data`.
"""

import dataclasses
import sys

import grain

class DataError(ValueError):
  """Stored data that cannot be read while a pipeline reads it; the message names the file and what to do."""


# seed is a common field of the data config; the dataclasses carry it so that examples are functions of their config.
_COMMON_FIELDS = frozenset({"seed"})


def defaults(cls):
  """The default of every field of config dataclass `cls` except the common seed, as a dict."""
  return {field.name: field.default for field in dataclasses.fields(cls) if field.name not in _COMMON_FIELDS}


def from_data(cls, data):
  """An instance of config dataclass `cls` from its fields of the `data` ConfigDict."""
  names = [field.name for field in dataclasses.fields(cls)]
  missing = [name for name in names if name not in data]
  if missing:
    raise ValueError(f"config.data: {data.name} needs the fields {missing}; start from default_data_config")
  return cls(**{name: data[name] for name in names})


def indexed_examples(make_example, split, eval_examples):
  """Examples that are functions of their index: make_example(0), make_example(1), ...; eval_examples of them in
  validation, unboundedly many in train."""
  num_examples = sys.maxsize if split == "train" else eval_examples
  return grain.MapDataset.range(num_examples).map(make_example)
