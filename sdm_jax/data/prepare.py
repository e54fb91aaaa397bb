"""Pre-tokenizing a corpus: inputs -> documents -> token ids -> ArrayRecord shards and a manifest (sdm_jax.data.shards
describes the directory).

Sources (sdm_jax.data.documents) are cut, in sorted order, into groups of about shard_bytes of text; group g becomes
the shards train-g and validation-g. Each document goes to the split that a hash of its text picks
(seeding.split_by_hash), so the split follows the content, and a document that occurs twice is in one split. A
corpus too small for a split to get a document that way (a few files) gets the one whose hash is nearest to that
split's part of the range (recorded in the manifest's "forced_splits"), so both splits hold at least one document;
fewer than two documents, or empty inputs, are an error. The manifest is rewritten after every finished group: a run
that stops (killed, out of disk) resumes where it stopped, skipping the groups recorded as finished whose shards
check out, and a complete directory is never written again. A call that fails removes the directory it created,
and a directory whose first group was never finished is started again, so a failed try never blocks the next.

Tokenizing runs in parallel inside the tokenizers library (encode_batch over ENCODE_BATCH documents at a time, on
all cores); reading, hashing and writing records stay in this process.
"""

import hashlib
import json
import os
import pathlib
import shutil
import time

from array_record.python import array_record_module

from sdm_jax.data import documents, shards
from sdm_jax.data import tokenizer as tokenizers_lib
from sdm_jax.data.seeding import SPLITS, split_by_hash

DEFAULT_SHARD_BYTES = 64 << 20
DEFAULT_VALIDATION_FRACTION = 0.05
ENCODE_BATCH = 512
TRAIN_PREFIX = "train:"


def plan_groups(sizes, shard_bytes):
  """Source indices cut into consecutive groups of at least shard_bytes (the last may hold less)."""
  if shard_bytes < 1:
    raise ValueError(f"shard_bytes: expected a positive number of bytes, got {shard_bytes}")
  groups, current, size = [], [], 0
  for index, source_size in enumerate(sizes):
    current.append(index)
    size += source_size
    if size >= shard_bytes:
      groups.append(current)
      current, size = [], 0
  return groups + [current] if current else groups


def _train_documents(sources, validation_fraction):
  for source in sources:
    for document in documents.read_documents(source):
      if split_by_hash(document.encode(), validation_fraction) == "train":
        yield document


def _tokenizer(spec, sources, out, validation_fraction, existing, log):
  """(tokenizer, its "tokenizer" manifest entry less the eos fields) for spec "train:VOCAB" or a path; the tokenizer
  is saved as out/tokenizer.json either way. An unfinished run's trained tokenizer is loaded, not trained again."""
  path = out / shards.TOKENIZER
  if spec.startswith(TRAIN_PREFIX):
    try:
      size = int(spec[len(TRAIN_PREFIX):])
    except ValueError:
      raise ValueError(f"tokenizer: expected a tokenizer.json path or 'train:VOCAB', got {spec!r}") from None
    if existing is not None and existing["tokenizer"]["source"] == spec and path.is_file():
      log(f"tokenizer: {path} (trained by the run being resumed)")
      tokenizer = tokenizers_lib.load_tokenizer(path)
    else:
      log(f"tokenizer: training a byte-level BPE of {size} tokens on the train documents")
      start = time.perf_counter()
      tokenizer = tokenizers_lib.train_tokenizer(_train_documents(sources, validation_fraction), size, path)
      log(f"tokenizer: trained in {time.perf_counter() - start:.1f} s, saved to {path}")
  else:
    tokenizer = tokenizers_lib.load_tokenizer(spec)
    if not (path.exists() and os.path.samefile(spec, path)):
      shutil.copyfile(spec, path)
    log(f"tokenizer: {spec} (copied to {path})")
  source = spec if spec.startswith(TRAIN_PREFIX) else str(pathlib.Path(spec).absolute())  # where it came from
  return tokenizer, {"path": shards.TOKENIZER, "source": source, "sha256": tokenizers_lib.file_sha256(path),
                     "vocab_size": tokenizers_lib.vocab_size(tokenizer)}


def _digest(document):
  return hashlib.sha256(document.encode()).hexdigest()


def _split(document, validation_fraction, forced):
  """The split of a document: its entry in `forced` ({sha256 hex: split}, the small-corpus rule), else its hash's."""
  if forced and (split := forced.get(_digest(document))):
    return split
  return split_by_hash(document.encode(), validation_fraction)


def _write_group(out, group, sources, tokenizer, eos_id, dtype, validation_fraction, forced=None):
  """Tokenizes the documents of one group into its shards; returns {split: shard entry} for the non-empty splits.

  Each shard is written under a .partial name and renamed when closed, so a shard file that exists is whole.
  """
  writers, entries = {}, {}
  for split in SPLITS:  # a split this group no longer writes (the small-corpus rule moved its one document)
    (out / shards.shard_name(split, group)).unlink(missing_ok=True)

  def write(batch):
    for document, encoding in zip(batch, tokenizer.encode_batch(batch, add_special_tokens=False)):
      if not encoding.ids:
        continue
      split = _split(document, validation_fraction, forced)
      if split not in writers:
        entries[split] = {"path": shards.shard_name(split, group), "group": group, "documents": 0, "tokens": 0,
                          "bytes": 0}
        partial = out / (entries[split]["path"] + ".partial")
        writers[split] = array_record_module.ArrayRecordWriter(str(partial), shards.WRITER_OPTIONS)
      writers[split].write(shards.encode_document(encoding.ids, eos_id, dtype))
      entry = entries[split]
      entry["documents"] += 1
      entry["tokens"] += len(encoding.ids) + 1
      entry["bytes"] += len(document.encode())

  batch = []
  for source in sources:
    for document in documents.read_documents(source):
      batch.append(document)
      if len(batch) == ENCODE_BATCH:
        write(batch)
        batch = []
  if batch:
    write(batch)
  for split, writer in writers.items():
    writer.close()
    final = out / entries[split]["path"]
    os.replace(out / (entries[split]["path"] + ".partial"), final)
    entries[split]["file_bytes"] = final.stat().st_size
  return entries


def _group_is_written(out, manifest, group):
  """Whether the manifest records `group` as finished and each of its shards checks out."""
  if group not in manifest["finished_groups"]:
    return False
  try:
    for split in SPLITS:
      for shard in manifest["splits"][split]["shards"]:
        if shard["group"] == group:
          shards.check_shard(out, shard)
  except ValueError:
    return False
  return True


def _totals(entries):
  totals = {key: sum(entry[key] for entry in entries) for key in ("documents", "tokens", "bytes")}
  totals["tokens_per_byte"] = totals["tokens"] / max(totals["bytes"], 1)
  return totals


def prepare(inputs, tokenizer, out, *, validation_fraction=DEFAULT_VALIDATION_FRACTION,
            shard_bytes=DEFAULT_SHARD_BYTES, eos_token=None, log=print):
  """Tokenizes the documents of `inputs` into shards under `out`; returns the manifest.

  inputs: globs and names (sdm_jax.data.documents.expand_inputs); tokenizer: a tokenizer.json path, or
  "train:VOCAB" to train a byte-level BPE of VOCAB tokens on the train documents; eos_token: the end-of-document
  token of a loaded tokenizer when it is none of tokenizer.EOS_TOKENS.
  Raises FileExistsError when `out` already holds a complete corpus, and ValueError when it holds an unfinished
  one prepared from other inputs or settings, for inputs without text or with fewer than two documents, and for a
  bad setting.
  """
  out = pathlib.Path(out)
  if not 0.0 < validation_fraction < 1.0:
    raise ValueError(f"validation_fraction: expected a fraction in (0, 1), got {validation_fraction}")
  if shard_bytes < 1:
    raise ValueError(f"shard_bytes: expected a positive number of bytes, got {shard_bytes}")
  if out.exists() and not out.is_dir():
    raise ValueError(f"out: {str(out)!r} is a file; expected a directory to write the corpus in")
  existing = shards.read_manifest(out)
  if existing is not None and existing["complete"]:
    raise FileExistsError(f"out: {str(out)!r} already holds a complete corpus "
                          f"({existing['splits']['train']['documents']:,} train documents); delete it or choose "
                          f"another directory")
  if existing is not None and not existing["finished_groups"]:
    existing = None  # a start that wrote no shard group holds nothing to resume: start again, whatever its flags
  sources = documents.expand_inputs(inputs)
  sizes = [documents.source_size(source) for source in sources]
  if not sum(sizes):
    raise ValueError(f"inputs: the {len(sources)} file(s) of {inputs!r} are empty; expected text to prepare")
  created = not out.exists()
  out.mkdir(parents=True, exist_ok=True)
  try:
    return _prepare(sources, sizes, tokenizer, out, existing, validation_fraction, shard_bytes, eos_token, log)
  except Exception:
    if created:  # nothing of this call is worth resuming; a directory left behind would refuse the next try
      shutil.rmtree(out, ignore_errors=True)
    raise


def _prepare(sources, sizes, tokenizer, out, existing, validation_fraction, shard_bytes, eos_token, log):
  log(f"inputs: {len(sources)} sources, {sum(sizes) / 1e6:.1f} MB of text")
  tokenizer, tokenizer_entry = _tokenizer(tokenizer, sources, out, validation_fraction, existing, log)
  eos = tokenizers_lib.eos_id(tokenizer, eos_token)
  tokenizer_entry.update(eos_id=eos, eos_token=tokenizer.id_to_token(eos))
  settings = {"sources": sources, "sizes": sizes, "tokenizer": tokenizer_entry,
              "validation_fraction": validation_fraction, "shard_bytes": shard_bytes}
  fingerprint = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
  if existing is not None and existing["fingerprint"] != fingerprint:
    raise ValueError(f"out: {str(out)!r} holds an unfinished corpus prepared from other inputs, tokenizer or "
                     f"settings; delete it or run again with the flags it was started with")
  groups = plan_groups(sizes, shard_bytes)
  manifest = existing or {
      "format": shards.FORMAT, "complete": False, "tokenizer": tokenizer_entry,
      "token_dtype": shards.token_dtype(tokenizer_entry["vocab_size"]), "sources": sources,
      "validation_fraction": validation_fraction, "shard_bytes": shard_bytes, "fingerprint": fingerprint,
      "num_groups": len(groups), "finished_groups": [], "splits": {split: {"shards": []} for split in SPLITS}}
  manifest.setdefault("forced_splits", {})
  shards.write_json(out / shards.MANIFEST, manifest)

  def write_group(group):
    entries = _write_group(out, group, [sources[i] for i in groups[group]], tokenizer, eos, manifest["token_dtype"],
                           validation_fraction, manifest["forced_splits"])
    for split in SPLITS:
      kept = [shard for shard in manifest["splits"][split]["shards"] if shard["group"] != group]
      manifest["splits"][split]["shards"] = sorted(kept + ([entries[split]] if split in entries else []),
                                                   key=lambda shard: shard["group"])
    manifest["finished_groups"] = sorted(set(manifest["finished_groups"]) | {group})
    shards.write_json(out / shards.MANIFEST, manifest)
    return entries

  start, written_bytes = time.perf_counter(), 0
  for group, members in enumerate(groups):
    if _group_is_written(out, manifest, group):
      log(f"[{group + 1}/{len(groups)}] shard group {group}: written by an earlier run, skipped")
      continue
    entries = write_group(group)
    written_bytes += sum(sizes[i] for i in members)
    elapsed = time.perf_counter() - start
    counts = ", ".join(f"{split} {entry['documents']:,} documents / {entry['tokens']:,} tokens"
                       for split, entry in entries.items())
    log(f"[{group + 1}/{len(groups)}] shard group {group}: {counts}; {written_bytes / 1e6 / elapsed:.2f} MB/s")

  counts = {split: sum(shard["documents"] for shard in manifest["splits"][split]["shards"]) for split in SPLITS}
  if sum(counts.values()) < 2:
    raise ValueError(f"inputs: {len(sources)} source(s) hold {sum(counts.values())} document(s) with text; a corpus "
                     f"needs at least 2 (one to train on, one to validate on)")
  for split in SPLITS:
    if not counts[split]:
      digest, source = _nearest_document(sources, split, validation_fraction)
      manifest["forced_splits"][digest] = split
      group = next(g for g, members in enumerate(groups) if sources.index(source) in members)
      write_group(group)
      log(f"{split}: no document's hash fell in its part of the split (validation_fraction {validation_fraction}, "
          f"{sum(counts.values())} documents); the document of {source} nearest to it is the {split} split")
  for split in SPLITS:
    manifest["splits"][split].update(_totals(manifest["splits"][split]["shards"]))
    if not manifest["splits"][split]["documents"]:  # every document the same text
      raise ValueError(f"inputs: the {split} split has no document: the {sum(counts.values())} documents are one "
                       f"text; a corpus needs two different ones")
  manifest["complete"] = True
  shards.write_json(out / shards.MANIFEST, manifest)
  train = manifest["splits"]["train"]
  log(f"done: {out} holds {train['documents']:,} train documents ({train['tokens']:,} tokens, "
      f"{train['tokens_per_byte']:.3f} tokens per byte) and {manifest['splits']['validation']['documents']:,} "
      f"validation documents")
  return manifest


def _nearest_document(sources, split, validation_fraction):
  """(sha256 hex, source) of the document whose hash is nearest to `split`'s part of the hash range (the lowest
  for validation, the highest for train): the small-corpus rule's choice when no document's hash fell there."""
  best = None
  for source in sources:
    for document in documents.read_documents(source):
      value = int.from_bytes(hashlib.sha256(document.encode()).digest()[:8], "little")
      key = value if split == "validation" else -value
      if best is None or key < best[0]:
        best = (key, _digest(document), source)
  return best[1], best[2]
