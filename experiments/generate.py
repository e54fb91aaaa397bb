r"""Generates tokens from the newest checkpoint of a run with the constant-memory recurrent decoder.

  python -m experiments.generate --workdir=runs/demo --prompt_tokens=1,2,3 --max_new_tokens=32

Prints the generated token ids, one line per prompt (one prompt here), space-separated.
"""

from absl import app, flags, logging

from experiments import cli

flags.DEFINE_string("workdir", None, "A run directory written by experiments.train.", required=True)
flags.DEFINE_list("prompt_tokens", None, "The prompt as comma-separated token ids.", required=True)
flags.DEFINE_integer("max_new_tokens", 32, "How many tokens to generate after the prompt.")
flags.DEFINE_float("temperature", 0.0, "Softmax temperature; 0 is greedy decoding.")
flags.DEFINE_integer("top_k", None, "Sample only from the k most likely tokens (default: all).")
flags.DEFINE_integer("seed", 0, "Sampling seed.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup()
  import jax.numpy as jnp
  from sdm_jax.training.loop import load_config, restore_for_eval
  config = load_config(FLAGS.workdir)
  model, step, _ = restore_for_eval(FLAGS.workdir, config)
  prompt = jnp.array([[int(token) for token in FLAGS.prompt_tokens]], jnp.int32)
  tokens = model.generate(prompt, FLAGS.max_new_tokens, temperature=FLAGS.temperature, top_k=FLAGS.top_k,
                          seed=FLAGS.seed)
  logging.info("checkpoint step %d", step)
  for row in tokens.tolist():
    print(" ".join(map(str, row)))


if __name__ == "__main__":
  app.run(main)
