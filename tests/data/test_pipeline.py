"""make_dataset / make_iterator: tasks found by name, shapes, determinism, exact sharding of the global batch,
checkpointable iterators."""

import json
import re
import types

import grain
import ml_collections
import numpy as np
import pytest
from etils import epath

from corpus_helpers import VOCAB
from sdm_jax.data import TASKS, default_data_config, make_dataset, make_iterator, task
from sdm_jax.data.pipeline import make_examples

# A small config of every registered task; a task missing here fails the tests parametrized over TASKS.
SMALL = {
    "mqar": dict(vocab_size=64, seq_len=32, num_kv_pairs=4, num_queries=3, batch_size=8, eval_examples=40),
    "niah": dict(seq_len=512, num_needles=2, num_queries=2, haystack="text", batch_size=4, eval_examples=16,
                 max_bytes=60_000),
    "text": dict(seq_len=64, batch_size=8, max_bytes=60_000),
    "corpus": dict(vocab_size=VOCAB, seq_len=32, batch_size=4),  # data_dir: the tiny_corpus fixture's
}
# Tasks that pack documents into rows add the rows' segment ids and positions to each batch.
PACKED = {name for name, source in TASKS.items() if hasattr(source, "batches")}


@pytest.fixture(autouse=True)
def _prepared_corpus(request):
  """Prepares the tiny corpus (once a session) for the tests that read the corpus task."""
  params = getattr(request.node, "callspec", None)
  if params is not None and params.params.get("name") == "corpus":
    SMALL["corpus"]["data_dir"] = str(request.getfixturevalue("tiny_corpus")[0])


def _config(task_name, **fields):
  config = ml_collections.ConfigDict()
  config.data = default_data_config(task_name)
  config.data.update({**SMALL[task_name], **fields})
  return config


def _take(iterator, count):
  return [next(iterator) for _ in range(count)]


def _assert_same(batches, others):
  assert len(batches) == len(others)
  for batch, other in zip(batches, others):
    assert batch.keys() == other.keys() >= {"inputs", "targets", "mask"}
    for key in batch:
      np.testing.assert_array_equal(batch[key], other[key])


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("split", ["train", "validation"])
def test_batches_have_the_declared_shapes(name, split):
  config = _config(name)
  batch = next(make_iterator(config, split))
  shape = (config.data.batch_size, config.data.seq_len)
  packed = {"segment_ids": (shape, np.int32), "positions": (shape, np.int32)} if name in PACKED else {}
  assert {key: (value.shape, value.dtype) for key, value in batch.items()} == {
      "inputs": (shape, np.int32), "targets": (shape, np.int32), "mask": (shape, np.float32), **packed}
  assert 0 <= batch["inputs"].min() and batch["targets"].max() < config.data.vocab_size
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])


@pytest.mark.parametrize("name", sorted(TASKS))
def test_same_seed_same_batches_other_seed_other_batches(name):
  batches = _take(make_iterator(_config(name, seed=5), "train"), 3)
  # Batches are functions of their index alone, so the reader's thread count cannot change them.
  _assert_same(batches, _take(make_iterator(_config(name, seed=5, num_threads=0), "train"), 3))
  others = _take(make_iterator(_config(name, seed=6), "train"), 3)
  assert not any(np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(batches, others))


def _toy_examples(data, split):
  """Example i of the toy task is i (train) or 1000 + i (validation) at every position, so a batch shows its indices."""
  offset = 0 if split == "train" else 1000

  def make_example(index):
    tokens = np.full(data.seq_len + 1, offset + index, np.int32)
    return {"inputs": tokens[:-1], "targets": tokens[1:], "mask": np.ones(data.seq_len, np.float32)}

  return task.indexed_examples(make_example, split, data.eval_examples)


TOY_TASK = types.SimpleNamespace(default_config=lambda: {"vocab_size": 2000, "seq_len": 3, "eval_examples": 10},
                                 examples=_toy_examples)


def _first_tokens(batches):
  return [batch["inputs"][:, 0].tolist() for batch in batches]


def test_a_registered_task_flows_through_the_pipeline(monkeypatch):
  monkeypatch.setitem(TASKS, "toy", TOY_TASK)
  config = ml_collections.ConfigDict()
  config.data = default_data_config("toy")
  assert (config.data.name, config.data.seed, config.data.seq_len, config.data.eval_examples) == ("toy", 0, 3, 10)
  config.data.batch_size = 4
  train = _take(make_iterator(config, "train"), 2)
  assert train[0]["inputs"].shape == (4, 3) and _first_tokens(train) == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert _first_tokens(_take(make_iterator(config, "train", shard_index=1, shard_count=2), 2)) == [[2, 3], [6, 7]]
  # 10 validation examples make two whole batches of 4.
  assert _first_tokens(make_dataset(config, "validation")) == [[1000, 1001, 1002, 1003], [1004, 1005, 1006, 1007]]


def test_task_names_and_fields_are_checked(monkeypatch):
  with pytest.raises(ValueError, match=re.escape(f"data.name: expected one of {tuple(TASKS)}, got 'wikitext'")):
    default_data_config("wikitext")
  monkeypatch.setitem(TASKS, "toy", types.SimpleNamespace(default_config=lambda: {"seed": 1, "seq_len": 3}))
  with pytest.raises(ValueError, match=re.escape("the common fields ['seed']")):
    default_data_config("toy")
  config = _config("mqar")
  del config.data.num_kv_pairs
  with pytest.raises(ValueError, match=re.escape("mqar needs the fields ['num_kv_pairs']")):
    make_dataset(config, "train")


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("split", ["train", "validation"])
@pytest.mark.parametrize("shard_count", [2, 4])
def test_shards_concatenate_to_the_unsharded_batch(name, split, shard_count):
  """The batches of processes 0, 1, ... of shard_count, concatenated in process order (the rows
  jax.make_array_from_process_local_data puts on each process's devices of the data mesh), are the batches one
  process reads."""
  config = _config(name)
  if split == "train":
    unsharded = _take(make_iterator(config, split), 3)
    shards = [_take(make_iterator(config, split, shard_index=k, shard_count=shard_count), 3)
              for k in range(shard_count)]
  else:
    unsharded = list(make_dataset(config, split))
    shards = [list(make_dataset(config, split, shard_index=k, shard_count=shard_count)) for k in range(shard_count)]
    assert {len(shard) for shard in shards} == {len(unsharded)} and len(unsharded) >= 4
  for step, batch in enumerate(unsharded):
    for key in batch:
      assert shards[0][step][key].shape[0] == config.data.batch_size // shard_count
      np.testing.assert_array_equal(np.concatenate([shard[step][key] for shard in shards]), batch[key])


def test_validation_is_finite_whole_global_batches():
  config = _config("mqar", eval_examples=44)
  assert len(list(make_dataset(config, "validation"))) == 44 // 8
  assert [len(list(make_dataset(config, "validation", shard_index=k, shard_count=2))) for k in (0, 1)] == [5, 5]


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("shard_index, shard_count", [(0, 1), (1, 2)])
def test_restored_iterator_continues_exactly(name, shard_index, shard_count):
  config = _config(name)
  iterator = make_iterator(config, "train", shard_index=shard_index, shard_count=shard_count)
  _take(iterator, 3)
  # Orbax's grain handler stores the state as JSON text; go through bytes as a checkpoint on disk would.
  blob = json.dumps(iterator.get_state()).encode()
  assert len(blob) < (300 if name in PACKED else 100)  # packing iterators also keep their place in a packed batch
  expected = _take(iterator, 2)
  restored = make_iterator(config, "train", shard_index=shard_index, shard_count=shard_count)
  restored.set_state(json.loads(blob.decode()))
  _assert_same(_take(restored, 2), expected)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_state_restores_across_a_change_of_shard_count(name):
  """Every shard's iterator state is that of the unsharded stream at the same batch, so the one state a checkpoint
  keeps (process 0's) resumes a run on another number of processes."""
  config = _config(name)
  iterator = make_iterator(config, "train")
  _take(iterator, 3)
  state, expected = json.loads(json.dumps(iterator.get_state())), next(iterator)
  halves = []
  for shard_index in (0, 1):
    shard = make_iterator(config, "train", shard_index=shard_index, shard_count=2)
    _take(shard, 3)
    assert json.loads(json.dumps(shard.get_state())) == state
    restored = make_iterator(config, "train", shard_index=shard_index, shard_count=2)
    restored.set_state(state)
    halves.append(next(restored))
  for key in expected:
    np.testing.assert_array_equal(np.concatenate([half[key] for half in halves]), expected[key])


def test_grain_checkpoint_handler_restores_the_stream(tmp_path):
  config = _config("text")
  iterator = make_iterator(config, "train")
  _take(iterator, 3)
  grain.checkpoint.CheckpointHandler().save(epath.Path(tmp_path), item=iterator)
  expected = next(iterator)
  restored = grain.checkpoint.CheckpointHandler().restore(epath.Path(tmp_path), item=make_iterator(config, "train"))
  _assert_same([next(restored)], [expected])


def test_text_train_reshuffles_each_epoch():
  config = _config("text", max_bytes=4_000)
  examples = make_examples(config.data, "train")
  other_seed = make_examples(_config("text", max_bytes=4_000, seed=1).data, "train")
  count = (4_000 - 1) // 64

  def epoch(dataset, number):
    return [dataset[number * count + i]["inputs"].tobytes() for i in range(count)]

  first, second = epoch(examples, 0), epoch(examples, 1)
  assert sorted(first) == sorted(second) and len(set(first)) == count
  assert first != second and first != epoch(other_seed, 0)


@pytest.mark.parametrize("fields, kwargs, message", [
    (dict(batch_size=8), dict(shard_count=3), "batch_size"),
    (dict(), dict(shard_index=2, shard_count=2), "shard_index"),
    (dict(name="wikitext"), dict(), "data.name"),
    (dict(eval_examples=4), dict(split="validation"), "fewer examples"),
])
def test_bad_requests_raise(fields, kwargs, message):
  config = _config("mqar", **fields)
  with pytest.raises(ValueError, match=message):
    make_dataset(config, kwargs.pop("split", "train"), **kwargs)
