"""Hugging Face tokenizers: any tokenizer.json loaded from a path (a Llama, GPT-2 or Qwen one), or a byte-level BPE
trained on a corpus's documents with the library's own trainer.

A trained tokenizer is GPT-2's scheme: the ByteLevel pre-tokenizer (GPT-2's split regex, every byte one of 256
alphabet symbols, so any text encodes without unknown tokens), BPE merges over those symbols, and one special token,
TRAINED_EOS, which ends every document.
"""

import hashlib
import pathlib

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

TRAINED_EOS = "<|endoftext|>"
# The end-of-document tokens of common tokenizer.json files, in the order looked for: GPT-2 and Qwen, Llama 3,
# Llama 2 and Mistral, Gemma.
EOS_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
# The 256 byte symbols and the end-of-document token come before any merge.
MIN_TRAINED_VOCAB = len(pre_tokenizers.ByteLevel.alphabet()) + 1


def load_tokenizer(path):
  """The tokenizers.Tokenizer saved at `path` (a tokenizer.json); ValueError naming the path if it cannot be read."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise ValueError(f"tokenizer: {str(path)!r} is not a file; expected a tokenizer.json")
  try:
    return tokenizers.Tokenizer.from_file(str(path))
  except Exception as error:  # the Rust side raises plain Exceptions for JSON and schema errors alike
    raise ValueError(f"tokenizer: {str(path)!r} is not a readable tokenizer.json ({error})") from error


def train_tokenizer(texts, vocab_size, path):
  """A byte-level BPE of vocab_size tokens (TRAINED_EOS included) trained on the strings of `texts`, saved at
  `path`."""
  if not isinstance(vocab_size, int) or vocab_size < MIN_TRAINED_VOCAB:
    raise ValueError(f"vocab_size: expected at least {MIN_TRAINED_VOCAB} (256 bytes and {TRAINED_EOS}), "
                     f"got {vocab_size!r}")
  tokenizer = tokenizers.Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[TRAINED_EOS],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tokenizer.train_from_iterator(texts, trainer=trainer)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tokenizer.save(str(path))
  return tokenizer


def eos_id(tokenizer, eos_token=None):
  """The id of eos_token, or of the first of EOS_TOKENS the tokenizer has; ValueError when it has none."""
  candidates = (eos_token,) if eos_token else EOS_TOKENS
  for token in candidates:
    token_id = tokenizer.token_to_id(token)
    if token_id is not None:
      return token_id
  raise ValueError(f"eos_token: the tokenizer has none of {candidates}; name its end-of-document token")


def vocab_size(tokenizer):
  """One more than the largest id the tokenizer can produce, added (special) tokens included: the embedding rows a
  model needs (added tokens' ids need not follow the base vocabulary's contiguously)."""
  return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def file_sha256(path):
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


BYTE_LEVEL_TASKS = ("text", "niah")  # data tasks whose token ids 0-255 are bytes


def decode_bytes(ids):
  """Token ids of a byte-level run as text: ids 0-255 are bytes, the rest (specials) U+FFFD."""
  return b"".join(bytes([i]) if 0 <= i < 256 else "\ufffd".encode() for i in ids).decode("utf-8", "replace")


def text_codec(data):
  """(encode: str -> ids, decode: ids -> str) of a run's data config, or None where its tokens are not text: bytes
  for the byte-level tasks, the corpus's tokenizer.json for the corpus task (ValueError naming it if unreadable)."""
  if data.get("name") in BYTE_LEVEL_TASKS:
    return (lambda text: list(text.encode("utf-8"))), decode_bytes
  if data.get("name") == "corpus":
    tokenizer = load_tokenizer(pathlib.Path(data["data_dir"]) / "tokenizer.json")
    return (lambda text: tokenizer.encode(text).ids), tokenizer.decode
  return None
