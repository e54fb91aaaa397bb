r"""Tokenizes text into ArrayRecord shards of documents and a manifest, for the corpus task (sdm_jax.data.prepare).

  python -m experiments.prepare_data --out=data/stdlib
  python -m experiments.prepare_data --inputs='corpus/*.jsonl,books/**/*.txt' \
      --tokenizer=/models/llama3/tokenizer.json --out=data/books_llama3

--inputs: comma-separated globs of .txt / .py / .jsonl ("text" field) / .parquet ("text" column, needs pyarrow)
files, or "stdlib" (the CPython standard library's sources and its reference documentation, no download) or
"pydoc" (the documentation alone). --tokenizer: a tokenizer.json, or train:VOCAB for a byte-level BPE trained on the
train documents and saved in --out. A stopped run resumes when started again with the same flags; a complete --out
is never overwritten.
"""

from absl import flags

from experiments import cli

flags.DEFINE_string("inputs", "stdlib", "Comma-separated globs of .txt/.py/.jsonl/.parquet files, or stdlib / pydoc.")
flags.DEFINE_string("tokenizer", "train:4096", "A tokenizer.json path, or train:VOCAB to train a byte-level BPE.")
flags.DEFINE_string("out", None, "The corpus directory to write.", required=True)
flags.DEFINE_float("validation_fraction", 0.05, "Fraction of documents (by a hash of their text) in validation.")
flags.DEFINE_integer("shard_mb", 64, "Megabytes of input text per shard group.")
flags.DEFINE_string("eos_token", None, "The end-of-document token of a loaded tokenizer, if not a usual one.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup()
  from sdm_jax.data.prepare import prepare
  try:
    prepare(FLAGS.inputs, FLAGS.tokenizer, FLAGS.out, validation_fraction=FLAGS.validation_fraction,
            shard_bytes=FLAGS.shard_mb << 20, eos_token=FLAGS.eos_token, log=lambda line: print(line, flush=True))
  except (FileExistsError, ValueError) as error:  # a complete --out, a bad input, tokenizer or setting
    cli.fail(error)


if __name__ == "__main__":
  cli.run(main)
