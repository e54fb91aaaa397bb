"""Documents packed into rows with grain's packing transforms, and the rows made language-model batches.

A row holds seq_len + 1 tokens of one or more documents (grain's `*_segment_ids`: 1, 2, ... per document, 0 on
padding; `*_positions`: 0, 1, ... within each). Its inputs are the first seq_len tokens and its targets the last
seq_len, so a target is scored only where it continues the input's document: the loss mask drops padding and the
target after each document's last token (the first token of the next document, which the input's document cannot
predict once the model restarts its state at the boundary, DESIGN.md section 9).

PACKINGS:
  "first_fit": grain.experimental.FirstFitPackIterDataset: each document goes whole into the first of
    `num_bins` rows with room, the rows are emitted (shuffled) once one does not fit; documents longer than a row
    are first cut into pieces of seq_len + 1 tokens that overlap by one, so every token but a document's first is
    a target once. Rows end in padding.
  "concat_then_split": grain.experimental.ConcatThenSplitIterDataset: documents concatenated and cut every
    seq_len + 1 tokens, a document split across rows restarting at position 0 in the next; no padding but the
    stream's end.
"""

import grain
import numpy as np

PACKINGS = ("first_fit", "concat_then_split")
FEATURE = "tokens"


class _Pieces(grain.experimental.FlatMapTransform):
  """A document -> pieces of at most `length` tokens, consecutive pieces sharing one token."""

  def __init__(self, length):
    self.length = length
    self.max_fan_out = None  # only MapDataset.flat_map reads it; this runs on an IterDataset

  def flat_map(self, element):
    tokens = element[FEATURE]
    if len(tokens) <= self.length:
      return [element]
    starts = range(0, len(tokens) - 1, self.length - 1)
    return [{FEATURE: tokens[start:start + self.length]} for start in starts]


def pack(documents, *, seq_len, packing, num_bins, seed, shuffle_bins):
  """documents: an IterDataset of {"tokens": [n] int32}, n >= 1 -> rows {"tokens", "tokens_segment_ids",
  "tokens_positions": [seq_len + 1] int32}."""
  if packing not in PACKINGS:
    raise ValueError(f"data.packing: expected one of {PACKINGS}, got {packing!r}")
  if seq_len < 1:
    raise ValueError(f"data.seq_len: expected a positive number of tokens, got {seq_len}")
  length = {FEATURE: seq_len + 1}
  if packing == "concat_then_split":
    return grain.experimental.ConcatThenSplitIterDataset(documents, length_struct=length)
  if num_bins < 1:
    raise ValueError(f"data.packing_bins: expected a positive number of rows, got {num_bins}")
  pieces = grain.experimental.FlatMapIterDataset(documents, _Pieces(seq_len + 1))
  return grain.experimental.FirstFitPackIterDataset(pieces, length_struct=length, num_packing_bins=num_bins,
                                                    seed=seed, shuffle_bins=shuffle_bins)


def language_model_batch(rows):
  """Batched rows [B, T + 1] -> {"inputs", "targets", "segment_ids", "positions": [B, T] int32,
  "mask": [B, T] float32}."""
  tokens, segments = rows[FEATURE], rows[f"{FEATURE}_segment_ids"]
  input_segments = segments[:, :-1]
  mask = (input_segments > 0) & (input_segments == segments[:, 1:])
  return {"inputs": tokens[:, :-1].astype(np.int32), "targets": tokens[:, 1:].astype(np.int32),
          "mask": mask.astype(np.float32), "segment_ids": input_segments.astype(np.int32),
          "positions": rows[f"{FEATURE}_positions"][:, :-1].astype(np.int32)}


def _tuple_slices(state):
  # ConcatThenSplit's state keeps slices as tuples and compares them with a tuple sentinel, so the lists they
  # become in JSON (orbax's JsonSave, grain's CheckpointHandler) would restore a different stream (grain 0.2.18).
  if isinstance(state, dict):
    return {key: ({name: tuple(value) for name, value in inner.items()} if key == "remainder_slices"
                  else _tuple_slices(inner)) for key, inner in state.items()}
  return state


class _JsonStateIterator(grain.DatasetIterator):

  def __next__(self):
    return next(self._parent)

  def get_state(self):
    return self._parent.get_state()

  def set_state(self, state):
    self._parent.set_state(_tuple_slices(state))


class JsonStateIterDataset(grain.IterDataset):
  """The parent's stream, whose iterators restore from a state that went through JSON."""

  def __iter__(self):
    return _JsonStateIterator(self._parent.__iter__())
