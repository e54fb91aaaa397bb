"""Language modelling on a pre-tokenized corpus (experiments/prepare_data.py writes one; sdm_jax.data.shards describes
it): documents packed into rows with segment ids and positions (sdm_jax.data.packing).

Train: every document of the split, shuffled globally from the seed and again each epoch, repeated without end.
Validation: the documents in order; the last partial batch is dropped. Both are packed into global batches of
data.batch_size rows on every host, shard k of n taking rows [k * b, (k + 1) * b) with b = batch_size / n, so the
shards' batches concatenate to the unsharded one (what one process reads), every host yields the same number of
batches, and every shard's iterator holds the same state: the one state a checkpoint keeps (process 0's) resumes
every host, on any number of hosts. Each host reads and packs every document; shards of disjoint documents, each
packed on its own host, would make a run's batches depend on the number of hosts and its checkpoint miss the
other hosts' states.

A batch is {"inputs", "targets", "segment_ids", "positions": [B, T] int32, "mask": [B, T] float32}
(packing.language_model_batch). Evaluation adds bits per byte: the mean loss in bits times the split's targets per
UTF-8 byte of text. A document of n tokens and its end-of-document token gives n targets (its first token is never
one), so that ratio is (tokens - documents) / bytes from the manifest: exact over the whole split, an estimate over
a few batches (and concat_then_split loses one target where it cuts a document).
"""

import dataclasses
import functools
import math

import grain
import numpy as np

from sdm_jax.data import packing, shards, task

DEFAULT_DATA_DIR = "data/stdlib"
PATH_FIELDS = ("data_dir",)  # made absolute when a run starts (training.workdir.absolute_paths)
DEFAULT_VOCAB_SIZE = 4096  # experiments.prepare_data's default tokenizer, train:4096


@dataclasses.dataclass(frozen=True)
class TokenCorpusConfig:
  """data_dir: a prepared corpus directory; vocab_size: the model's vocabulary, at least the tokenizer's;
  packing: one of packing.PACKINGS; packing_bins: first-fit's rows packed at once (0: the rows of one global
  batch, data.batch_size; more rows leave less padding); document_masks: False leaves segment_ids and positions
  out of the batches, so the model runs each row as one sequence whose state crosses document starts (the
  unpacked kernels; for comparing throughput)."""
  data_dir: str = DEFAULT_DATA_DIR
  vocab_size: int = DEFAULT_VOCAB_SIZE
  seq_len: int = 1024
  packing: str = "first_fit"
  packing_bins: int = 0
  document_masks: bool = True
  seed: int = 0


def default_config():
  return task.defaults(TokenCorpusConfig)


def _manifest(config):
  manifest = shards.load_manifest(config.data_dir)
  needed = manifest["tokenizer"]["vocab_size"]
  if config.vocab_size < needed:
    raise ValueError(f"data.vocab_size: the corpus in {config.data_dir!r} has ids up to {needed - 1} "
                     f"({manifest['tokenizer']['source']}), so it needs at least {needed}, got {config.vocab_size}; "
                     f"set data.vocab_size and model.vocab_size")
  return manifest


class ShardRecords:
  """The records of a split's shards in order (grain's ArrayRecord source); a record that does not read (a shard
  damaged after it was checked: ArrayRecord checks its chunks' hashes only as it reads them) raises
  task.DataError naming the shard."""

  def __init__(self, paths, counts):
    self.paths, self.ends = list(paths), np.cumsum(counts)
    self.source = grain.sources.ArrayRecordDataSource(self.paths)

  def __len__(self):
    return len(self.source)

  def __getitem__(self, index):
    try:
      return self.source[index]
    except Exception as error:  # the reader raises bare RuntimeErrors (Riegeli's), which name no file
      shard = int(np.searchsorted(self.ends, index, side="right"))
      record = index - (int(self.ends[shard - 1]) if shard else 0)
      reason = (str(error).strip().splitlines() or [""])[0][:200]
      raise task.DataError(f"corpus shard {self.paths[shard]!r} is damaged: its record {record} does not read "
                           f"({type(error).__name__}: {reason}); prepare the corpus again") from None


def check(data):
  """ValueError unless the corpus directory is a complete corpus whose ids fit data.vocab_size and the packing is
  known (the manifest is read, not the shards)."""
  config = task.from_data(TokenCorpusConfig, data)
  if config.packing not in packing.PACKINGS:
    raise ValueError(f"packing: expected one of {packing.PACKINGS}, got {config.packing!r}")
  _check_validation_size(_manifest(config), data.batch_size, config.seq_len)


def _check_validation_size(manifest, batch_size, seq_len):
  tokens = manifest["splits"]["validation"]["tokens"]
  if tokens < batch_size * (seq_len + 1):
    raise ValueError(f"corpus validation: {tokens} tokens, fewer than one global batch of {batch_size} rows of "
                     f"{seq_len + 1}; lower data.batch_size or data.seq_len")


def _document(dtype, record):
  return {packing.FEATURE: shards.decode_document(record, dtype)}


def _rows_of_shard(start, stop, rows):
  return {key: value[start:stop] for key, value in rows.items()}


def batches(data, split, *, shard_index, shard_count, read_options):
  """The batches of shard `shard_index` of `shard_count` as a grain.IterDataset (see the module docstring)."""
  config = task.from_data(TokenCorpusConfig, data)
  manifest = _manifest(config)
  counts = [shard["documents"] for shard in manifest["splits"][split]["shards"]]
  documents = grain.MapDataset.source(ShardRecords(shards.split_paths(config.data_dir, split, manifest), counts))
  documents = documents.map(functools.partial(_document, manifest["token_dtype"]))
  if split == "train":
    # As in the text task: shuffle folds the epoch into its seed, so the seed is mixed first.
    seed = int(np.random.SeedSequence(config.seed).generate_state(1)[0])
    documents, shuffle_bins = documents.shuffle(seed=seed).repeat(), True
  else:
    _check_validation_size(manifest, data.batch_size, config.seq_len)
    seed, shuffle_bins = 0, False
  rows = packing.pack(documents.to_iter_dataset(read_options), seq_len=config.seq_len, packing=config.packing,
                      num_bins=config.packing_bins or data.batch_size, seed=seed, shuffle_bins=shuffle_bins)
  rows_per_shard = data.batch_size // shard_count
  start = shard_index * rows_per_shard
  result = rows.batch(data.batch_size, drop_remainder=True).map(
      functools.partial(_rows_of_shard, start, start + rows_per_shard))
  result = result.map(packing.language_model_batch)
  if not config.document_masks:
    result = result.map(lambda batch: {k: v for k, v in batch.items() if k not in ("segment_ids", "positions")})
  return packing.JsonStateIterDataset(result)


def eval_metrics(data, split, loss):
  """{"bits_per_byte"} of a mean loss per target token (nats) on `split`."""
  totals = _manifest(task.from_data(TokenCorpusConfig, data))["splits"][split]
  return {"bits_per_byte": loss / math.log(2) * (totals["tokens"] - totals["documents"]) / totals["bytes"]}
