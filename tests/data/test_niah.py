"""Needle in a haystack: each queried answer sits after its key in the haystack, and exact_match scores it."""

import re

import numpy as np
import pytest

from sdm_jax.data import niah, text


@pytest.fixture(scope="module")
def corpus():
  return text.load_corpus("validation", max_bytes=200_000)


def _queries(example):
  """(key bytes, answer bytes) for each query, read back from the token stream and the mask."""
  inputs, targets, mask = example["inputs"], example["targets"], example["mask"]
  queries = []
  for start in np.flatnonzero(inputs == niah.QUERY_ID):
    stop = start + 1 + np.flatnonzero(inputs[start + 1:] == niah.ANSWER_ID)[0]
    assert mask[stop] == 1.0 and mask[start:stop].sum() == 0.0
    end = stop + np.flatnonzero(np.append(mask[stop:], 0.0) == 0.0)[0]
    queries.append((bytes(inputs[start + 1:stop].astype(np.uint8)), bytes(targets[stop:end].astype(np.uint8))))
  return queries


@pytest.mark.parametrize("haystack, seq_len, num_needles, num_queries", [
    ("noise", 1024, 1, 1), ("text", 1024, 4, 2), ("text", 8192, 8, 3), ("noise", 2048, 3, 3)])
def test_answers_follow_their_keys_in_the_haystack(corpus, haystack, seq_len, num_needles, num_queries):
  config = niah.NIAHConfig(seq_len=seq_len, num_needles=num_needles, num_queries=num_queries, haystack=haystack)
  for index in range(4):
    example = niah.make_example(config, "train", index, corpus=corpus)
    inputs, targets, mask = example["inputs"], example["targets"], example["mask"]
    assert inputs.shape == targets.shape == mask.shape == (seq_len,)
    np.testing.assert_array_equal(inputs[1:], targets[:-1])
    assert inputs.min() >= 0 and inputs.max() < niah.VOCAB_SIZE
    assert mask.sum() == num_queries * config.value_length
    context = bytes(inputs[:np.flatnonzero(inputs == niah.QUERY_ID)[0]].astype(np.uint8))
    queries = _queries(example)
    assert len(queries) == num_queries and len({key for key, _ in queries}) == num_queries
    assert context.count(b"special magic numbers for ") == num_needles
    for key, answer in queries:
      assert len(answer) == config.value_length and answer.isdigit()
      assert context.count(key) == 1
      assert b"for " + key + b" is: " + answer + b"." in context


def test_exact_match_scores_gold_one_and_corrupted_zero(corpus):
  config = niah.NIAHConfig(seq_len=1024, num_needles=3, num_queries=2, haystack="text")
  examples = [niah.make_example(config, "validation", index, corpus=corpus) for index in range(3)]
  batch = {key: np.stack([example[key] for example in examples]) for key in ("targets", "mask")}
  assert niah.exact_match(batch["targets"], batch) == 1.0
  corrupted = batch["targets"].copy()
  answer_starts = np.flatnonzero(np.diff(batch["mask"][0], prepend=0) == 1)
  assert len(answer_starts) == 2
  corrupted[0, answer_starts[1] + 3] = ord("x")
  assert niah.exact_match(corrupted, batch) == pytest.approx(5 / 6)
  corrupted[batch["mask"] > 0] = ord("x")
  assert niah.exact_match(corrupted, batch) == 0.0
  with pytest.raises(ValueError, match="shape"):
    niah.exact_match(corrupted[:, :-1], batch)


def test_bad_configs_raise():
  with pytest.raises(ValueError, match="seq_len"):
    niah.NIAHConfig(seq_len=128, num_needles=4)
  with pytest.raises(ValueError, match="num_queries"):
    niah.NIAHConfig(num_needles=2, num_queries=3)
  with pytest.raises(ValueError, match="haystack"):
    niah.NIAHConfig(haystack="novel")
  with pytest.raises(ValueError, match="value_type"):
    niah.NIAHConfig(value_type="words")
  with pytest.raises(ValueError, match="corpus"):
    niah.make_example(niah.NIAHConfig(haystack="text"), "train", 0)


@pytest.mark.parametrize("task", sorted(niah.RULER_TASKS))
@pytest.mark.parametrize("seq_len", [1024, 4096])
def test_ruler_tasks(task, seq_len):
  """Each of RULER's variants: its haystack, needle count, key and value kinds, one scored answer per query."""
  fields = niah.RULER_TASKS[task]
  config = niah.NIAHConfig(seq_len=seq_len, **fields)
  corpus = niah.load_essays("validation") if config.haystack == "essay" else None
  uuid = re.compile(rb"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
  for index in range(3):
    example = niah.make_example(config, "validation", index, corpus=corpus)
    inputs, mask = example["inputs"], example["mask"]
    assert inputs.shape == mask.shape == (seq_len,)
    context = bytes(inputs[:np.flatnonzero(inputs == niah.QUERY_ID)[0]].astype(np.uint8))
    needles = re.findall(rb"\nOne of the special magic (numbers|uuids) for (\S+) is: (\S+)\.\n", context)
    assert {kind for kind, _, _ in needles} == {fields["value_type"].encode()}
    if fields["haystack"] == "needles":  # the haystack is needles: all but a noise prefix shorter than one
      assert len(needles) == len(context) // niah.needle_length(config) >= 8
      assert context.startswith(niah.NOISE_TEXT[:len(context) % niah.needle_length(config)])
    else:
      assert len(needles) == fields["num_needles"]
    if fields["haystack"] == "essay":
      assert b"The grass is green" not in context and context.count(b" the ") > 5  # prose, not the noise
    keys = [key for _, key, _ in needles]
    assert len(set(keys)) == len(keys)
    queries = _queries(example)
    assert len(queries) == fields["num_queries"] == 1 and mask.sum() == niah.value_bytes(config)
    (key, answer), = queries
    assert (key, answer) in {(k, v) for _, k, v in needles} and context.count(key) == 1
    assert bool(uuid.match(key)) == (fields["key_type"] == "uuids")
    assert bool(uuid.match(answer)) == (fields["value_type"] == "uuids")
    if fields["value_type"] == "numbers":
      assert answer.isdigit() and len(answer) == config.value_length and answer[:1] != b"0"


def test_essays_split_by_topic_and_differ_from_the_stdlib_text():
  train, validation = niah.load_essays("train"), niah.load_essays("validation")
  assert validation.size > 8192 and train.size > 4 * validation.size
  assert bytes(validation[:4000]) not in bytes(train)
