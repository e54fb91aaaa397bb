"""The grain pipeline: examples -> (per-epoch shuffle for text) -> per-shard batches -> a checkpointable iterator.

Every stage before to_iter_dataset is a random-access grain.MapDataset, so an iterator's whole state is the index of
its next batch ({"next_index": n}) and a restored iterator recomputes exactly the batches that would have followed.

Sharding: the example stream is cut into micro-batches of batch_size // shard_count examples and shard k takes
micro-batches k, k + shard_count, k + 2 * shard_count, ... Batch n of shard k is therefore examples
[n * batch_size + k * b, n * batch_size + (k + 1) * b) of the unsharded stream: concatenating the shards' n-th batches
in shard order gives exactly the n-th batch of shard_count=1, which is the process order in which
jax.make_array_from_process_local_data assembles a global batch (shard_index = jax.process_index()).
"""

import dataclasses
import functools
import sys

import grain
import ml_collections
import numpy as np

from sdm_jax.data import mqar, niah, text
from sdm_jax.data.seeding import check_split

NAMES = ("mqar", "niah", "text")


def default_data_config(name):
  """The `data` sub-config of task `name`: batch_size is global (all shards), seq_len counts input tokens."""
  if name not in NAMES:
    raise ValueError(f"data.name: expected one of {NAMES}, got {name!r}")
  data = ml_collections.ConfigDict()
  data.name = name
  data.seed = 0
  data.batch_size = 32
  # The prefetch buffer counts batches; grain's default of 500 would hold hundreds of MB of long-context batches.
  data.num_threads = 2
  data.prefetch_buffer_size = 8
  if name == "mqar":
    data.vocab_size = 8192
    data.seq_len = 256
    data.num_kv_pairs = 16
    data.num_queries = 16
    data.noise = False
    data.key_range = None
    data.value_range = None
    data.eval_examples = 1024
  elif name == "niah":
    data.vocab_size = niah.VOCAB_SIZE
    data.seq_len = 4096
    data.num_needles = 1
    data.num_queries = 1
    data.haystack = "noise"
    data.key_length = 8
    data.value_length = 7
    data.eval_examples = 1024
    data.validation_fraction = 0.05
    data.max_bytes = None
  else:
    data.vocab_size = text.VOCAB_SIZE
    data.seq_len = 1024
    data.validation_fraction = 0.05
    data.max_bytes = None
  return data


def _task_config(cls, data):
  names = [field.name for field in dataclasses.fields(cls)]
  missing = [name for name in names if name not in data]
  if missing:
    raise ValueError(f"config.data: {data.name} needs the fields {missing}; start from default_data_config")
  return cls(**{name: data[name] for name in names})


def make_examples(data, split):
  """The unbatched examples of `split` as a grain.MapDataset; train sets are infinite (len sys.maxsize)."""
  check_split(split)
  if data.name not in NAMES:
    raise ValueError(f"data.name: expected one of {NAMES}, got {data.name!r}")
  if data.name == "text":
    corpus = text.load_corpus(split, validation_fraction=data.validation_fraction, max_bytes=data.max_bytes)
    examples = grain.MapDataset.source(text.PackedSequences(corpus, data.seq_len))
    if split == "train":
      # shuffle folds the epoch into its seed (seed + epoch); mixing the seed first keeps seed s + 1 from replaying
      # epoch 1 of seed s.
      shuffle_seed = int(np.random.SeedSequence(data.seed).generate_state(1)[0])
      examples = examples.shuffle(seed=shuffle_seed).repeat()
    return examples
  if data.name == "mqar":
    make_example = functools.partial(mqar.make_example, _task_config(mqar.MQARConfig, data), split)
  else:
    config = _task_config(niah.NIAHConfig, data)
    corpus = None
    if config.haystack == "text":
      corpus = text.load_corpus(split, validation_fraction=data.validation_fraction, max_bytes=data.max_bytes)
    make_example = functools.partial(niah.make_example, config, split, corpus=corpus)
  num_examples = sys.maxsize if split == "train" else data.eval_examples
  return grain.MapDataset.range(num_examples).map(make_example)


def make_dataset(config, split, *, shard_index=0, shard_count=1):
  """The batches of `split` for shard `shard_index` of `shard_count`, as a grain.IterDataset.

  Each batch is {"inputs": [B, T] int32, "targets": [B, T] int32, "mask": [B, T] float32} with
  B = config.data.batch_size // shard_count and T = config.data.seq_len. Train is infinite; validation is finite,
  the same number of batches on every shard, with the last partial global batch dropped.
  """
  data = config.data
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index: expected 0 <= shard_index < shard_count = {shard_count}, got {shard_index}")
  if data.batch_size < shard_count or data.batch_size % shard_count:
    raise ValueError(f"data.batch_size: the global batch {data.batch_size} does not split evenly across "
                     f"{shard_count} shards")
  batches = make_examples(data, split).batch(data.batch_size // shard_count, drop_remainder=True)
  # Cut the finite stream to whole global batches so that no shard gets one batch more than another.
  batches = batches[:len(batches) // shard_count * shard_count]
  if not len(batches):
    raise ValueError(f"{data.name} {split}: fewer examples than one global batch of {data.batch_size}")
  batches = batches[shard_index::shard_count]
  read_options = grain.ReadOptions(num_threads=data.num_threads, prefetch_buffer_size=data.prefetch_buffer_size)
  return batches.to_iter_dataset(read_options)


def make_iterator(config, split, *, shard_index=0, shard_count=1):
  """A grain.DatasetIterator over make_dataset's batches; get_state() is a JSON-serializable dict."""
  return iter(make_dataset(config, split, shard_index=shard_index, shard_count=shard_count))
