"""The grain pipeline: a task's examples (TASKS[data.name]) -> per-shard batches -> a checkpointable iterator.

Every stage before to_iter_dataset is a random-access grain.MapDataset, so an iterator's whole state is the index of
its next batch ({"next_index": n}) and a restored iterator recomputes exactly the batches that would have followed.

Sharding: the example stream is cut into micro-batches of batch_size // shard_count examples and shard k takes
micro-batches k, k + shard_count, k + 2 * shard_count, ... Batch n of shard k is therefore examples
[n * batch_size + k * b, n * batch_size + (k + 1) * b) of the unsharded stream: concatenating the shards' n-th batches
in shard order gives exactly the n-th batch of shard_count=1, which is the process order in which
jax.make_array_from_process_local_data assembles a global batch (shard_index = jax.process_index()).

A task that packs documents into rows (corpus) batches and shards its own stream (task.py: `batches`); its
iterator's state is what grain's packing iterators keep, still JSON.
"""

import grain
import ml_collections

from sdm_jax.data import corpus, mqar, niah, text
from sdm_jax.data.seeding import check_split

# The data tasks by name: each provides default_config() and examples(data, split) or batches(...), as
# sdm_jax/data/task.py describes.
# A new task is a new module and one entry here.
TASKS = {"corpus": corpus, "mqar": mqar, "niah": niah, "text": text}


def _task(name):
  if name not in TASKS:
    raise ValueError(f"data.name: expected one of {tuple(TASKS)}, got {name!r}")
  return TASKS[name]


def default_data_config(name):
  """The `data` sub-config of task `name`: batch_size is global (all shards), seq_len counts input tokens.

  The common fields are set here, the task's own fields come from TASKS[name].default_config().
  """
  task_fields = _task(name).default_config()
  data = ml_collections.ConfigDict()
  data.name = name
  data.seed = 0
  data.batch_size = 32
  # The prefetch buffer counts batches; grain's default of 500 would hold hundreds of MB of long-context batches.
  data.num_threads = 2
  data.prefetch_buffer_size = 8
  if shadowed := sorted(set(data) & set(task_fields)):
    raise ValueError(f"{name}.default_config(): the common fields {shadowed} are set by default_data_config")
  data.update(task_fields)
  return data


def check_data(data):
  """ValueError naming the field unless the task's fields work together (the task's `check`, when it has one)."""
  source = _task(data.name)
  if hasattr(source, "check"):
    source.check(data)


def make_examples(data, split):
  """The unbatched examples of `split` as a grain.MapDataset; train sets are infinite (len sys.maxsize)."""
  check_split(split)
  source = _task(data.name)
  if not hasattr(source, "examples"):
    raise ValueError(f"data.name: {data.name} makes whole batches (it packs documents), not single examples")
  return source.examples(data, split)


def make_dataset(config, split, *, shard_index=0, shard_count=1):
  """The batches of `split` for shard `shard_index` of `shard_count`, as a grain.IterDataset.

  Each batch is {"inputs": [B, T] int32, "targets": [B, T] int32, "mask": [B, T] float32} with
  B = config.data.batch_size // shard_count and T = config.data.seq_len. Train is infinite; validation is finite,
  the same number of batches on every shard, with the last partial global batch dropped. A packing task's batches
  also carry "segment_ids" and "positions": [B, T] int32 (sdm_jax.data.corpus).
  """
  data = config.data
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index: expected 0 <= shard_index < shard_count = {shard_count}, got {shard_index}")
  if data.batch_size < shard_count or data.batch_size % shard_count:
    raise ValueError(f"data.batch_size: the global batch {data.batch_size} does not split evenly across "
                     f"{shard_count} shards")
  read_options = grain.ReadOptions(num_threads=data.num_threads, prefetch_buffer_size=data.prefetch_buffer_size)
  check_split(split)
  if hasattr(source := _task(data.name), "batches"):
    return source.batches(data, split, shard_index=shard_index, shard_count=shard_count, read_options=read_options)
  batches = make_examples(data, split).batch(data.batch_size // shard_count, drop_remainder=True)
  # Cut the finite stream to whole global batches so that no shard gets one batch more than another.
  batches = batches[:len(batches) // shard_count * shard_count]
  if not len(batches):
    raise ValueError(f"{data.name} {split}: fewer examples than one global batch of {data.batch_size}")
  batches = batches[shard_index::shard_count]
  return batches.to_iter_dataset(read_options)


def make_iterator(config, split, *, shard_index=0, shard_count=1):
  """A grain.DatasetIterator over make_dataset's batches; get_state() is a JSON-serializable dict."""
  return iter(make_dataset(config, split, shard_index=shard_index, shard_count=shard_count))


def eval_metrics(data, split, loss):
  """The task's own metrics of a mean evaluation loss on `split` (the corpus task's bits per byte), else {}."""
  source = _task(data.name)
  return source.eval_metrics(data, split, loss) if hasattr(source, "eval_metrics") else {}
