"""RULER-style needle in a haystack over bytes: find the values of queried keys hidden in a long context.

An example of seq_len T is built as T + 1 tokens (bytes 0-255 and the specials QUERY_ID, ANSWER_ID):

    haystack ... NEEDLE ... haystack ... NEEDLE ... haystack | QUERY key ANSWER value | QUERY key ANSWER value ...

Each needle is the byte text "\\nOne of the special magic numbers for <key> is: <value>.\\n" (RULER's template) with
a random lowercase key and a random decimal value, inserted at a uniformly random depth. num_queries of the
num_needles keys are asked, in random order; only the answer bytes are scored. The haystack is RULER's "noise"
(a few plain sentences repeated) or a random window of real text (the stdlib byte corpus, see text.py).
"""

import dataclasses
import functools

import numpy as np

from sdm_jax.data import task, text
from sdm_jax.data.seeding import example_rng

QUERY_ID = 256
ANSWER_ID = 257
VOCAB_SIZE = 258
EVAL_EXAMPLES = 1024
HAYSTACKS = ("noise", "text")
NOISE_TEXT = b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
_NEEDLE_PREFIX = b"\nOne of the special magic numbers for "
_NEEDLE_MIDDLE = b" is: "
_NEEDLE_SUFFIX = b".\n"
# A key that already occurs in the haystack would make the answer ambiguous; redrawing is rare (8 random letters).
_MAX_KEY_DRAWS = 16


@dataclasses.dataclass(frozen=True)
class NIAHConfig:
  seq_len: int = 4096
  num_needles: int = 1
  num_queries: int = 1
  haystack: str = "noise"
  key_length: int = 8
  value_length: int = 7
  seed: int = 0

  def __post_init__(self):
    if self.haystack not in HAYSTACKS:
      raise ValueError(f"haystack: expected one of {HAYSTACKS}, got {self.haystack!r}")
    if self.num_needles < 1 or not 1 <= self.num_queries <= self.num_needles:
      raise ValueError(f"num_needles, num_queries: expected 1 <= num_queries <= num_needles, got "
                       f"num_needles={self.num_needles}, num_queries={self.num_queries}")
    if self.key_length < 4 or self.value_length < 1:
      raise ValueError(f"key_length >= 4 (shorter keys collide with haystack words) and value_length >= 1 expected, "
                       f"got key_length={self.key_length}, value_length={self.value_length}")
    if haystack_length(self) < 0:
      raise ValueError(f"seq_len: {self.seq_len} cannot hold {self.num_needles} needles and {self.num_queries} "
                       f"queries; need seq_len >= {self.seq_len - haystack_length(self)}")


def needle_length(config):
  return len(_NEEDLE_PREFIX) + config.key_length + len(_NEEDLE_MIDDLE) + config.value_length + len(_NEEDLE_SUFFIX)


def haystack_length(config):
  """Bytes of haystack in one example: what is left of the T + 1 tokens after the needles and the queries."""
  query_length = 2 + config.key_length + config.value_length
  return config.seq_len + 1 - config.num_needles * needle_length(config) - config.num_queries * query_length


def _haystack(config, rng, corpus):
  length = haystack_length(config)
  if config.haystack == "noise":
    return np.resize(np.frombuffer(NOISE_TEXT, np.uint8), length)
  if corpus is None or corpus.size < length:
    raise ValueError(f"corpus: the text haystack needs a byte corpus of at least {length} bytes, got "
                     f"{None if corpus is None else corpus.size}")
  start = rng.integers(0, corpus.size - length + 1)
  return corpus[start:start + length]


def _keys(config, rng, haystack):
  haystack_bytes = haystack.tobytes()
  for _ in range(_MAX_KEY_DRAWS):
    keys = rng.integers(ord("a"), ord("z") + 1, (config.num_needles, config.key_length), dtype=np.uint8)
    if (len(np.unique(keys, axis=0)) == config.num_needles
        and not any(key.tobytes() in haystack_bytes for key in keys)):
      return keys
  raise ValueError(f"could not draw {config.num_needles} distinct keys absent from the haystack in {_MAX_KEY_DRAWS} "
                   "tries; raise key_length")


def make_example(config, split, index, corpus=None):
  """Example `index` of `split`: {"inputs": [T] int32, "targets": [T] int32, "mask": [T] float32}.

  corpus: a uint8 byte array (text.load_corpus), required for haystack="text".
  """
  rng = example_rng(config.seed, split, index)
  haystack = _haystack(config, rng, corpus)
  keys = _keys(config, rng, haystack)
  values = rng.integers(ord("0"), ord("9") + 1, (config.num_needles, config.value_length), dtype=np.uint8)
  values[:, 0] = rng.integers(ord("1"), ord("9") + 1, config.num_needles)  # no leading zero, as RULER's numbers
  depths = np.sort(rng.integers(0, haystack.size + 1, config.num_needles))
  queried = rng.choice(config.num_needles, config.num_queries, replace=False)

  def as_bytes(*pieces):
    return np.frombuffer(b"".join(pieces), np.uint8)

  parts, previous = [], 0
  for depth, key, value in zip(depths, keys, values):
    parts += [haystack[previous:depth], as_bytes(_NEEDLE_PREFIX, key.tobytes(), _NEEDLE_MIDDLE, value.tobytes(),
                                                 _NEEDLE_SUFFIX)]
    previous = depth
  parts.append(haystack[previous:])
  for needle in queried:
    parts += [[QUERY_ID], keys[needle], [ANSWER_ID], values[needle]]
  tokens = np.concatenate([np.asarray(part, np.int32) for part in parts])

  mask = np.zeros(config.seq_len, np.float32)
  # The token at ANSWER_ID's position predicts the first answer byte; the last answer byte predicts nothing scored.
  for start in np.flatnonzero(tokens == ANSWER_ID):
    mask[start:start + config.value_length] = 1.0
  return {"inputs": tokens[:-1], "targets": tokens[1:], "mask": mask}


def default_config():
  """The task's fields of the data config: NIAHConfig's defaults, the number of validation examples and the fields of
  the text haystack's corpus."""
  return {"vocab_size": VOCAB_SIZE, **task.defaults(NIAHConfig), "eval_examples": EVAL_EXAMPLES,
          **task.defaults(text.CorpusConfig)}


def examples(data, split):
  """make_example over indices 0, 1, ... of `split` as a grain.MapDataset: data.eval_examples in validation."""
  config = task.from_data(NIAHConfig, data)
  corpus = task.from_data(text.CorpusConfig, data).load(split) if config.haystack == "text" else None
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
