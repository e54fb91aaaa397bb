"""Multi-query associative recall (Zoology's MQAR): recall the values of keys seen earlier in the sequence.

An example of seq_len T is built as T + 1 tokens and split into next-token pairs:

    k1 v1 k2 v2 ... kN vN | filler ... kq vq filler ... kq' vq' filler ...

The context lists num_kv_pairs (key, value) pairs; the query region after it holds num_queries of those keys, each
at a random pair-aligned slot and followed by its value. Filler is PAD, or random tokens with `noise=True`. Only the
positions whose next token is a queried value are scored (mask 1).

Zoology's mixed training (min_kv_pairs > 0): each example draws its number of pairs N uniformly from the halvings
num_kv_pairs, num_kv_pairs / 2, ... down to min_kv_pairs (64, 32, 16, 8, 4 for 64 and 4) and asks
min(num_queries, N) of them, so one model sees every difficulty up to the largest; the sequence length stays seq_len.
"""

import dataclasses
import functools

import numpy as np

from sdm_jax.data import task
from sdm_jax.data.seeding import example_rng

PAD_ID = 0
NUM_SPECIAL_TOKENS = 1
EVAL_EXAMPLES = 1024


@dataclasses.dataclass(frozen=True)
class MQARConfig:
  """Token ranges are half-open [low, high); by default keys and values split the non-special vocab in halves."""
  vocab_size: int = 8192
  seq_len: int = 256
  num_kv_pairs: int = 16
  num_queries: int = 16
  noise: bool = False
  seed: int = 0
  key_range: tuple[int, int] | None = None
  value_range: tuple[int, int] | None = None
  min_kv_pairs: int = 0  # 0: every example has num_kv_pairs pairs; else the halvings down to it (module docstring)

  def __post_init__(self):
    middle = NUM_SPECIAL_TOKENS + (self.vocab_size - NUM_SPECIAL_TOKENS) // 2
    if self.key_range is None:
      object.__setattr__(self, "key_range", (NUM_SPECIAL_TOKENS, middle))
    if self.value_range is None:
      object.__setattr__(self, "value_range", (middle, self.vocab_size))
    object.__setattr__(self, "key_range", tuple(self.key_range))
    object.__setattr__(self, "value_range", tuple(self.value_range))
    _check(self)


def _check(config):
  (key_low, key_high), (value_low, value_high) = config.key_range, config.value_range
  for name, (low, high) in (("key_range", config.key_range), ("value_range", config.value_range)):
    if not NUM_SPECIAL_TOKENS <= low < high <= config.vocab_size:
      raise ValueError(f"{name}: expected {NUM_SPECIAL_TOKENS} <= low < high <= vocab_size = {config.vocab_size} "
                       f"(tokens below {NUM_SPECIAL_TOKENS} are special), got [{low}, {high})")
  if key_low < value_high and value_low < key_high:
    raise ValueError(f"key_range [{key_low}, {key_high}) and value_range [{value_low}, {value_high}) overlap; a "
                     "model could not tell a key from a value")
  if not 1 <= config.num_kv_pairs <= min(key_high - key_low, value_high - value_low):
    raise ValueError(f"num_kv_pairs: expected 1 <= num_kv_pairs <= {min(key_high - key_low, value_high - value_low)} "
                     f"(keys and values are drawn without replacement), got {config.num_kv_pairs}")
  if not 1 <= config.num_queries <= config.num_kv_pairs:
    raise ValueError(f"num_queries: expected 1 <= num_queries <= num_kv_pairs = {config.num_kv_pairs}, "
                     f"got {config.num_queries}")
  if config.min_kv_pairs and not 1 <= config.min_kv_pairs <= config.num_kv_pairs:
    raise ValueError(f"min_kv_pairs: expected 0 (no mixing) or 1 <= min_kv_pairs <= num_kv_pairs = "
                     f"{config.num_kv_pairs}, got {config.min_kv_pairs}")
  # The largest number of pairs needs the most room; fewer pairs leave more slots for fewer queries.
  slots = (config.seq_len + 1 - 2 * config.num_kv_pairs) // 2
  if slots < config.num_queries:
    raise ValueError(f"seq_len: {config.seq_len} leaves room for {max(slots, 0)} query pairs after "
                     f"{config.num_kv_pairs} key-value pairs; need {config.num_queries}, so seq_len >= "
                     f"{2 * (config.num_kv_pairs + config.num_queries) - 1}")


def kv_pairs_choices(config):
  """The numbers of key-value pairs an example may hold: (num_kv_pairs,), or its halvings down to min_kv_pairs."""
  if not config.min_kv_pairs:
    return (config.num_kv_pairs,)
  choices, count = [], config.num_kv_pairs
  while count >= config.min_kv_pairs:
    choices.append(count)
    count //= 2
  return tuple(choices)


def make_example(config, split, index):
  """Example `index` of `split`: {"inputs": [T] int32, "targets": [T] int32, "mask": [T] float32}."""
  rng = example_rng(config.seed, split, index)
  (key_low, key_high), (value_low, value_high) = config.key_range, config.value_range
  num_pairs, num_queries, seq_len = config.num_kv_pairs, config.num_queries, config.seq_len
  if config.min_kv_pairs:  # drawn only when mixing, so the fixed task's examples stay what they were
    num_pairs = int(rng.choice(kv_pairs_choices(config)))
    num_queries = min(num_queries, num_pairs)
  keys = key_low + rng.choice(key_high - key_low, num_pairs, replace=False)
  values = value_low + rng.choice(value_high - value_low, num_pairs, replace=False)
  if config.noise:
    tokens = rng.integers(NUM_SPECIAL_TOKENS, config.vocab_size, seq_len + 1)
  else:
    tokens = np.full(seq_len + 1, PAD_ID)
  tokens[0:2 * num_pairs:2] = keys
  tokens[1:2 * num_pairs:2] = values
  queried = rng.choice(num_pairs, num_queries, replace=False)
  num_slots = (seq_len + 1 - 2 * num_pairs) // 2
  # Pair-aligned slots keep every query key directly before its value, so no two queries overlap.
  key_positions = 2 * num_pairs + 2 * rng.choice(num_slots, num_queries, replace=False)
  tokens[key_positions] = keys[queried]
  tokens[key_positions + 1] = values[queried]
  mask = np.zeros(seq_len, np.float32)
  mask[key_positions] = 1.0
  return {"inputs": tokens[:-1].astype(np.int32), "targets": tokens[1:].astype(np.int32), "mask": mask}


def default_config():
  """The task's fields of the data config: MQARConfig's defaults and the number of validation examples."""
  return {**task.defaults(MQARConfig), "eval_examples": EVAL_EXAMPLES}


def check(data):
  """ValueError naming the field unless the task's fields work together (MQARConfig's checks; nothing is built)."""
  task.from_data(MQARConfig, data)


def examples(data, split):
  """make_example over indices 0, 1, ... of `split` as a grain.MapDataset: data.eval_examples in validation."""
  return task.indexed_examples(functools.partial(make_example, task.from_data(MQARConfig, data), split), split,
                               data.eval_examples)
