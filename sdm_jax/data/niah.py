"""RULER-style needle in a haystack over bytes: find the values of queried keys hidden in a long context.

An example of seq_len T is built as T + 1 tokens (bytes 0-255 and the specials QUERY_ID, ANSWER_ID):

    haystack ... NEEDLE ... haystack ... NEEDLE ... haystack | QUERY key ANSWER value | QUERY key ANSWER value ...

Each needle is the byte text "\\nOne of the special magic numbers for <key> is: <value>.\\n" (RULER's template;
"uuids" for uuid values) inserted at a uniformly random depth. Keys are random lowercase letters (standing in for
RULER's random words: a byte-level model trained from scratch knows no words) or uuids; values are decimal numbers
without a leading zero or uuids (8-4-4-4-12 lowercase hex). num_queries of the num_needles keys are asked, in random
order; only the answer bytes are scored. The haystack is RULER's

    noise    a few plain sentences repeated;
    essay    a random window of English prose: the CPython reference documentation (pydoc_data.topics), standing in
             for RULER's Paul Graham essays; topics split by a hash of their name;
    text     a random window of the stdlib's .py sources (the byte corpus of text.py);
    needles  distractor needles of the same template with keys of their own, as many as fit (RULER's
             multi-key "needle" haystack), the needles placed between them.

RULER_TASKS names RULER's single-needle and multi-key variants as field values of this config.
"""

import dataclasses
import functools

import numpy as np

from sdm_jax.data import task, text
from sdm_jax.data.seeding import example_rng, split_by_hash

QUERY_ID = 256
ANSWER_ID = 257
VOCAB_SIZE = 258
EVAL_EXAMPLES = 1024
HAYSTACKS = ("noise", "essay", "text", "needles")
KEY_TYPES = ("letters", "uuids")
VALUE_TYPES = ("numbers", "uuids")
UUID_LENGTH = 36
NOISE_TEXT = b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
_NEEDLE_MIDDLE = b" is: "
_NEEDLE_SUFFIX = b".\n"
# A key that already occurs in the haystack would make the answer ambiguous; redrawing is rare (8 random letters).
_MAX_KEY_DRAWS = 16
# 6 of the 79 topics, 78 KB of prose: validation windows of up to 8K bytes still start at many places.
ESSAY_VALIDATION_FRACTION = 0.1

# RULER's S-NIAH and MK-NIAH tasks (Hsieh et al. 2024, section 3.1) as NIAHConfig fields; seq_len is the caller's.
RULER_TASKS = {
    "s_niah_1": dict(haystack="noise", num_needles=1, num_queries=1, key_type="letters", value_type="numbers"),
    "s_niah_2": dict(haystack="essay", num_needles=1, num_queries=1, key_type="letters", value_type="numbers"),
    "s_niah_3": dict(haystack="essay", num_needles=1, num_queries=1, key_type="letters", value_type="uuids"),
    "mk_niah_1": dict(haystack="essay", num_needles=4, num_queries=1, key_type="letters", value_type="numbers"),
    "mk_niah_2": dict(haystack="needles", num_needles=1, num_queries=1, key_type="letters", value_type="numbers"),
    "mk_niah_3": dict(haystack="needles", num_needles=1, num_queries=1, key_type="uuids", value_type="uuids"),
}


@dataclasses.dataclass(frozen=True)
class NIAHConfig:
  """key_length: letters of a letters key; value_length: digits of a number value (uuids are UUID_LENGTH bytes)."""
  seq_len: int = 4096
  num_needles: int = 1
  num_queries: int = 1
  haystack: str = "noise"
  key_length: int = 8
  value_length: int = 7
  seed: int = 0
  key_type: str = "letters"
  value_type: str = "numbers"

  def __post_init__(self):
    for name, choices in (("haystack", HAYSTACKS), ("key_type", KEY_TYPES), ("value_type", VALUE_TYPES)):
      if getattr(self, name) not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {getattr(self, name)!r}")
    if self.num_needles < 1 or not 1 <= self.num_queries <= self.num_needles:
      raise ValueError(f"num_needles, num_queries: expected 1 <= num_queries <= num_needles, got "
                       f"num_needles={self.num_needles}, num_queries={self.num_queries}")
    if self.key_length < 4 or self.value_length < 1:
      raise ValueError(f"key_length >= 4 (shorter keys collide with haystack words) and value_length >= 1 expected, "
                       f"got key_length={self.key_length}, value_length={self.value_length}")
    if haystack_length(self) < 0:
      raise ValueError(f"seq_len: {self.seq_len} cannot hold {self.num_needles} needles and {self.num_queries} "
                       f"queries; need seq_len >= {self.seq_len - haystack_length(self)}")


def key_bytes(config):
  return config.key_length if config.key_type == "letters" else UUID_LENGTH


def value_bytes(config):
  """The answer's length in bytes: what the mask scores per query."""
  return config.value_length if config.value_type == "numbers" else UUID_LENGTH


def _needle_prefix(config):
  return b"\nOne of the special magic " + config.value_type.encode() + b" for "


def needle_length(config):
  return (len(_needle_prefix(config)) + key_bytes(config) + len(_NEEDLE_MIDDLE) + value_bytes(config)
          + len(_NEEDLE_SUFFIX))


def haystack_length(config):
  """Bytes of haystack in one example: what is left of the T + 1 tokens after the needles and the queries."""
  query_length = 2 + key_bytes(config) + value_bytes(config)
  return config.seq_len + 1 - config.num_needles * needle_length(config) - config.num_queries * query_length


@functools.lru_cache(maxsize=2)
def load_essays(split):
  """The reference documentation topics of `split` (by a hash of each topic's name), sorted by name and joined by
  blank lines, as a read-only uint8 array."""
  import pydoc_data.topics
  topics = pydoc_data.topics.topics
  chosen = [topics[name] for name in sorted(topics)
            if split_by_hash(name.encode(), ESSAY_VALIDATION_FRACTION) == split]
  corpus = np.frombuffer("\n\n".join(chosen).encode(), np.uint8)
  corpus.flags.writeable = False
  return corpus


def _window(rng, corpus, length):
  if corpus is None or corpus.size < length:
    raise ValueError(f"corpus: the text haystack needs a byte corpus of at least {length} bytes, got "
                     f"{None if corpus is None else corpus.size}")
  start = rng.integers(0, corpus.size - length + 1)
  return corpus[start:start + length]


def _uuids(rng, count):
  """[count, 36] uint8: random lowercase hex in the 8-4-4-4-12 layout."""
  digits = np.frombuffer(b"0123456789abcdef", np.uint8)[rng.integers(0, 16, (count, 32))]
  dash = np.full((count, 1), ord("-"), np.uint8)
  return np.concatenate([digits[:, :8], dash, digits[:, 8:12], dash, digits[:, 12:16], dash, digits[:, 16:20], dash,
                         digits[:, 20:]], axis=1)


def _keys(config, rng, count, haystack_bytes):
  """[count, key_bytes] distinct keys, none of them inside haystack_bytes."""
  for _ in range(_MAX_KEY_DRAWS):
    if config.key_type == "letters":
      keys = rng.integers(ord("a"), ord("z") + 1, (count, config.key_length), dtype=np.uint8)
    else:
      keys = _uuids(rng, count)
    if len(np.unique(keys, axis=0)) == count and not any(key.tobytes() in haystack_bytes for key in keys):
      return keys
  raise ValueError(f"could not draw {count} distinct keys absent from the haystack in {_MAX_KEY_DRAWS} tries; "
                   "raise key_length")


def _values(config, rng, count):
  if config.value_type == "uuids":
    return _uuids(rng, count)
  values = rng.integers(ord("0"), ord("9") + 1, (count, config.value_length), dtype=np.uint8)
  values[:, 0] = rng.integers(ord("1"), ord("9") + 1, count)  # no leading zero, as RULER's numbers
  return values


def _needle(config, key, value):
  return np.frombuffer(b"".join([_needle_prefix(config), key.tobytes(), _NEEDLE_MIDDLE, value.tobytes(),
                                 _NEEDLE_SUFFIX]), np.uint8)


def _context(config, rng, corpus):
  """(the context before the queries, keys [num_needles, key_bytes], values [num_needles, value_bytes])."""
  length = haystack_length(config)
  if config.haystack == "needles":
    # Distractors fill the haystack; what is left of it (less than one needle) is noise text in front.
    num_distractors = length // needle_length(config)
    keys = _keys(config, rng, config.num_needles + num_distractors, b"")
    values = _values(config, rng, config.num_needles + num_distractors)
    slots = np.sort(rng.integers(0, num_distractors + 1, config.num_needles))
    order = list(range(config.num_needles, config.num_needles + num_distractors))
    for needle, slot in reversed(list(enumerate(slots))):
      order.insert(slot, needle)
    parts = [np.resize(np.frombuffer(NOISE_TEXT, np.uint8), length % needle_length(config))]
    parts += [_needle(config, keys[i], values[i]) for i in order]
    return np.concatenate(parts), keys[:config.num_needles], values[:config.num_needles]
  if config.haystack == "noise":
    haystack = np.resize(np.frombuffer(NOISE_TEXT, np.uint8), length)
  else:
    haystack = _window(rng, corpus, length)
  keys = _keys(config, rng, config.num_needles, haystack.tobytes())
  values = _values(config, rng, config.num_needles)
  depths = np.sort(rng.integers(0, haystack.size + 1, config.num_needles))
  parts, previous = [], 0
  for depth, key, value in zip(depths, keys, values):
    parts += [haystack[previous:depth], _needle(config, key, value)]
    previous = depth
  parts.append(haystack[previous:])
  return np.concatenate(parts), keys, values


def make_example(config, split, index, corpus=None):
  """Example `index` of `split`: {"inputs": [T] int32, "targets": [T] int32, "mask": [T] float32}.

  corpus: a uint8 byte array, required for haystack "text" (text.load_corpus) and "essay" (load_essays).
  """
  rng = example_rng(config.seed, split, index)
  context, keys, values = _context(config, rng, corpus)
  queried = rng.choice(config.num_needles, config.num_queries, replace=False)
  parts = [context]
  for needle in queried:
    parts += [[QUERY_ID], keys[needle], [ANSWER_ID], values[needle]]
  tokens = np.concatenate([np.asarray(part, np.int32) for part in parts])

  mask = np.zeros(config.seq_len, np.float32)
  # The token at ANSWER_ID's position predicts the first answer byte; the last answer byte predicts nothing scored.
  for start in np.flatnonzero(tokens == ANSWER_ID):
    mask[start:start + value_bytes(config)] = 1.0
  return {"inputs": tokens[:-1], "targets": tokens[1:], "mask": mask}


def default_config():
  """The task's fields of the data config: NIAHConfig's defaults, the number of validation examples and the fields of
  the text haystack's corpus."""
  return {"vocab_size": VOCAB_SIZE, **task.defaults(NIAHConfig), "eval_examples": EVAL_EXAMPLES,
          **task.defaults(text.CorpusConfig)}


def check(data):
  """ValueError naming the field unless the task's fields work together (NIAHConfig's checks; nothing is read)."""
  task.from_data(NIAHConfig, data)


def examples(data, split):
  """make_example over indices 0, 1, ... of `split` as a grain.MapDataset: data.eval_examples in validation."""
  config = task.from_data(NIAHConfig, data)
  corpus = None
  if config.haystack == "text":
    corpus = task.from_data(text.CorpusConfig, data).load(split)
  elif config.haystack == "essay":
    corpus = load_essays(split)
  return task.indexed_examples(functools.partial(make_example, config, split, corpus=corpus), split,
                               data.eval_examples)


def exact_match(pred_tokens, example):
  """The fraction of queries whose answer is predicted exactly.

  pred_tokens: [..., T] predicted next tokens (e.g. argmax of teacher-forced logits), aligned with example["targets"];
  example: a dict with "targets" and "mask" of the same shape. Each contiguous run of mask ones is one answer.
  """
  pred = np.asarray(pred_tokens)
  targets = np.asarray(example["targets"])
  mask = np.asarray(example["mask"]) > 0
  if pred.shape != targets.shape or mask.shape != targets.shape or targets.ndim < 1:
    raise ValueError(f"pred_tokens, targets, mask: expected one shape [..., T], got {pred.shape}, {targets.shape}, "
                     f"{mask.shape}")
  pred, targets, mask = (x.reshape(-1, x.shape[-1]) for x in (pred, targets, mask))
  scores = []
  for row_pred, row_targets, row_mask in zip(pred, targets, mask):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], row_mask.astype(np.int8), [0]])))
    for start, stop in zip(edges[::2], edges[1::2]):
      scores.append(bool(np.all(row_pred[start:stop] == row_targets[start:stop])))
  if not scores:
    raise ValueError("example: the mask has no answer positions to score")
  return float(np.mean(scores))
