r"""Evaluates the newest checkpoint of a run on its validation split.

  .venv/bin/python -m experiments.eval --workdir=runs/mqar_gdn2

Prints loss, accuracy (for MQAR: recall accuracy on the queried values), perplexity, bits per byte (the corpus
task) and sequence exact match (every scored token right, RULER's scoring), and writes
them to <workdir>/eval.json (a non-finite value as null). A checkpoint that fails restore's checks is skipped
with a warning (and left where it is), and the one before it evaluated.
"""

import pathlib

from absl import flags

from experiments import cli

flags.DEFINE_string("workdir", None, "A run directory written by experiments.train.", required=True)
flags.DEFINE_integer("eval_batches", None, "Batches to evaluate (default: the run's config).",
                     lower_bound=1)
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup()
  import jax
  from sdm_jax import jsonio
  from sdm_jax.evaluation.lm_eval import evaluate
  from sdm_jax.training.config import check_batch
  from sdm_jax.training.loop import load_config, restore_for_eval
  config = load_config(FLAGS.workdir)
  if FLAGS.eval_batches:
    config.train.eval_batches = FLAGS.eval_batches
  check_batch(config, jax.device_count())  # this machine may have other devices than the run's
  model, step, mesh = restore_for_eval(FLAGS.workdir, config)
  print(f"evaluating step {step} on {config.train.eval_batches} validation batches", flush=True)
  result = {"step": step, **evaluate(model, config, mesh, log=lambda line: print(line, flush=True))}
  path = pathlib.Path(FLAGS.workdir) / "eval.json"
  path.write_text(jsonio.dumps(result, indent=2))
  bits_per_byte = f" bits per byte {result['bits_per_byte']:.4f}" if "bits_per_byte" in result else ""
  print(f"step {step}: loss {result['loss']:.4f} accuracy {result['accuracy']:.4f} "
        f"perplexity {result['perplexity']:.3f}{bits_per_byte} exact match {result['exact_match']:.4f} -> {path}")


if __name__ == "__main__":
  cli.run(main)
