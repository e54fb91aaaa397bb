r"""Generates tokens from the newest checkpoint of a run with the constant-memory recurrent decoder.

  .venv/bin/python -m experiments.generate --workdir=runs/demo --prompt_tokens=1,2,3 --max_new_tokens=32
  .venv/bin/python -m experiments.generate --workdir=runs/text_gdn2 --prompt="def main(" --max_new_tokens=64

Prints the generated token ids, one line per prompt (one prompt here), space-separated; for a run on text then the
text they decode to: a byte-level run (the text and niah tasks: UTF-8, bytes that do not decode and ids past 255 as
U+FFFD) or a corpus run (its corpus's tokenizer.json). --prompt gives such a run's prompt as text. Prompt ids
outside the run's vocabulary, top_k < 1 and max_new_tokens < 0 are refused (exit code 2).
"""

import sys

from absl import app, flags, logging

from experiments import cli

flags.DEFINE_string("workdir", None, "A run directory written by experiments.train.", required=True)
flags.DEFINE_list("prompt_tokens", None, "The prompt as comma-separated token ids (or --prompt).")
flags.DEFINE_string("prompt", None, "The prompt as text, for a byte-level or corpus run.")
flags.DEFINE_integer("max_new_tokens", 32, "How many tokens to generate after the prompt (>= 0).")
flags.DEFINE_float("temperature", 0.0, "Softmax temperature; 0 is greedy decoding.")
flags.DEFINE_integer("top_k", None, "Sample only from the k most likely tokens, k >= 1 (default: all).")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
FLAGS = flags.FLAGS


def prompt_ids(codec):
  """The prompt's token ids from --prompt_tokens or --prompt (one of them)."""
  if (FLAGS.prompt_tokens is None) == (FLAGS.prompt is None):
    raise app.UsageError("--prompt_tokens / --prompt: expected exactly one of them")
  if FLAGS.prompt is not None:
    if codec is None:
      raise app.UsageError("--prompt: text prompts need a run on text (a byte-level task or a corpus); give "
                           "--prompt_tokens")
    return codec[0](FLAGS.prompt)
  try:
    return [int(token) for token in FLAGS.prompt_tokens]
  except ValueError:
    raise app.UsageError(f"--prompt_tokens: expected comma-separated integers, got {FLAGS.prompt_tokens}") from None


def main(argv):
  del argv
  cli.setup()
  import jax.numpy as jnp
  from sdm_jax.data.tokenizer import text_codec
  from sdm_jax.models.generate import check_arguments
  from sdm_jax.training.loop import load_config, restore_for_eval
  config = load_config(FLAGS.workdir)
  try:
    codec = text_codec(config.data)
  except ValueError as error:
    raise app.UsageError(f"the run's corpus: {error}") from None
  prompt = [prompt_ids(codec)]
  try:
    check_arguments(prompt, FLAGS.max_new_tokens, temperature=FLAGS.temperature, top_k=FLAGS.top_k,
                    vocab_size=config.model.vocab_size)
  except ValueError as error:
    argument = str(error).split(":")[0]
    flag = {"prompt": "prompt_tokens" if FLAGS.prompt is None else "prompt"}.get(argument, argument)
    raise app.UsageError(f"--{flag}{str(error)[len(argument):]}") from None
  model, step, _ = restore_for_eval(FLAGS.workdir, config)
  tokens = model.generate(jnp.array(prompt, jnp.int32), FLAGS.max_new_tokens, temperature=FLAGS.temperature,
                          top_k=FLAGS.top_k, seed=FLAGS.seed)
  logging.info("checkpoint step %d", step)
  for row in tokens.tolist():
    print(" ".join(map(str, row)))
    if codec is not None:
      print(codec[1](row))
  sys.stdout.flush()


if __name__ == "__main__":
  cli.run(main)
