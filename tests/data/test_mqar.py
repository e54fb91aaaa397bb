"""MQAR examples: every scored target is the value paired with the queried key in the context."""

import numpy as np
import pytest

from sdm_jax.data import mqar


@pytest.mark.parametrize("noise", [False, True])
def test_queries_recall_their_context_values(noise):
  config = mqar.MQARConfig(vocab_size=128, seq_len=64, num_kv_pairs=8, num_queries=5, noise=noise, seed=3)
  (key_low, key_high), (value_low, value_high) = config.key_range, config.value_range
  assert key_low == mqar.NUM_SPECIAL_TOKENS and key_high == value_low and value_high == config.vocab_size
  for index in range(50):
    example = mqar.make_example(config, "train", index)
    inputs, targets, mask = example["inputs"], example["targets"], example["mask"]
    assert inputs.shape == targets.shape == mask.shape == (64,)
    assert (inputs.dtype, targets.dtype, mask.dtype) == (np.int32, np.int32, np.float32)
    np.testing.assert_array_equal(inputs[1:], targets[:-1])
    assert inputs.min() >= 0 and max(inputs.max(), targets.max()) < config.vocab_size
    keys, values = inputs[0:16:2], inputs[1:16:2]
    assert np.all((keys >= key_low) & (keys < key_high)) and len(set(keys)) == 8
    assert np.all((values >= value_low) & (values < value_high)) and len(set(values)) == 8
    context = dict(zip(keys.tolist(), values.tolist()))
    scored = np.flatnonzero(mask)
    assert mask.sum() == 5 and set(np.unique(mask)) <= {0.0, 1.0}
    assert np.all(scored >= 16) and len(set(inputs[scored])) == 5
    for position in scored:
      assert targets[position] == context[inputs[position]]
    if not noise:
      # Without noise the only value tokens after the context are the queried answers.
      is_value = (targets >= value_low) & (targets < value_high)
      np.testing.assert_array_equal(np.flatnonzero(is_value[16:]) + 16, scored)


def test_examples_are_functions_of_seed_split_and_index():
  config = mqar.MQARConfig(vocab_size=64, seq_len=32, num_kv_pairs=4, num_queries=4)
  first = mqar.make_example(config, "train", 7)
  np.testing.assert_array_equal(first["inputs"], mqar.make_example(config, "train", 7)["inputs"])
  for other in (mqar.make_example(config, "train", 8), mqar.make_example(config, "validation", 7),
                mqar.make_example(mqar.MQARConfig(vocab_size=64, seq_len=32, num_kv_pairs=4, num_queries=4, seed=1),
                                  "train", 7)):
    assert not np.array_equal(first["inputs"], other["inputs"])


def test_mixed_pairs_every_query_answerable_and_only_answers_scored():
  """Zoology's mixed training: each example holds 16, 8 or 4 pairs, asks min(num_queries, pairs) of them, and the
  mask is 1 exactly where the next token is a queried key's value."""
  config = mqar.MQARConfig(vocab_size=8192, seq_len=128, num_kv_pairs=16, num_queries=12, min_kv_pairs=4, seed=1)
  assert mqar.kv_pairs_choices(config) == (16, 8, 4)
  (key_low, key_high), (value_low, value_high) = config.key_range, config.value_range
  seen = set()
  for index in range(60):
    example = mqar.make_example(config, "train", index)
    inputs, targets, mask = example["inputs"], example["targets"], example["mask"]
    is_key = (inputs >= key_low) & (inputs < key_high)
    pairs = len(set(inputs[is_key].tolist()))  # keys are distinct, and every query repeats a context key
    seen.add(pairs)
    assert np.all(is_key[0:2 * pairs:2]) and np.all(inputs[1:2 * pairs:2] >= value_low)
    context = dict(zip(inputs[0:2 * pairs:2].tolist(), inputs[1:2 * pairs:2].tolist()))
    scored = np.flatnonzero(mask)
    assert mask.sum() == min(12, pairs) and set(np.unique(mask)) <= {0.0, 1.0}
    assert all(targets[p] == context[inputs[p]] for p in scored)  # every query is answerable from the context
    queries = np.flatnonzero(is_key[2 * pairs:]) + 2 * pairs
    np.testing.assert_array_equal(queries, scored)  # no key after the context goes unscored, no other token scored
  assert seen == {16, 8, 4}
  fixed = mqar.MQARConfig(vocab_size=128, seq_len=64, num_kv_pairs=8, num_queries=5, seed=3)
  assert mqar.kv_pairs_choices(fixed) == (8,)
  with pytest.raises(ValueError, match="min_kv_pairs"):
    mqar.MQARConfig(vocab_size=128, seq_len=64, num_kv_pairs=8, num_queries=5, min_kv_pairs=9)


@pytest.mark.parametrize("fields, message", [
    (dict(num_queries=9), "num_queries"),
    (dict(seq_len=20), "seq_len"),
    (dict(key_range=(1, 40), value_range=(30, 64)), "overlap"),
    (dict(key_range=(0, 30)), "key_range"),
    (dict(num_kv_pairs=40), "num_kv_pairs"),
])
def test_bad_configs_raise(fields, message):
  with pytest.raises(ValueError, match=message):
    mqar.MQARConfig(**{**dict(vocab_size=64, seq_len=32, num_kv_pairs=8, num_queries=8), **fields})
