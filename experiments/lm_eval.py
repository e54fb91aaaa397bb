r"""Evaluates the newest checkpoint of a run on lm-evaluation-harness tasks (EleutherAI's lm_eval).

  .venv/bin/python -m experiments.lm_eval --workdir=runs/corpus_gdn2 --tasks=lambada_openai,piqa,wikitext
  .venv/bin/python -m experiments.lm_eval --workdir=runs/corpus_gdn2 --tasks=path/to/task.yaml --limit=100

--tasks: harness task names (their data sets come from the Hugging Face hub) and task YAML files (a local task:
`dataset_path: json` with `dataset_kwargs: {data_files: {test: path/to/docs.jsonl}}`). The run must be on text: a
corpus run (its tokenizer.json and the end-of-document id of its manifest) or a byte-level one. Multiple-choice and
perplexity tasks score tokens with the model's training forward, batched by length; generation tasks decode with
the recurrent decoder. Prints the harness's table and writes <workdir>/lm_eval.json (the checkpoint's step, the
per-task metrics). Needs the optional extra "eval": pip install -e ".[eval]". A bad flag, task or run is one line
on stderr and exit code 2.
"""

import pathlib

from absl import app, flags

from experiments import cli

flags.DEFINE_string("workdir", None, "A run directory written by experiments.train.", required=True)
flags.DEFINE_list("tasks", None, "Harness task names and task YAML files, comma-separated.", required=True)
flags.DEFINE_integer("limit", None, "Evaluate at most this many documents of each task.", lower_bound=1)
flags.DEFINE_integer("num_fewshot", None, "Few-shot examples in each context (default: each task's own).",
                     lower_bound=0)
flags.DEFINE_integer("batch_size", 16, "Rows scored in one forward.", lower_bound=1)
flags.DEFINE_integer("max_length", None, "The longest row scored, in tokens (default: the run's data.seq_len).",
                     lower_bound=2)
flags.DEFINE_integer("bootstrap_iters", 100000, "Resamples for the standard errors the harness bootstraps (0: "
                     "none).", lower_bound=0)
FLAGS = flags.FLAGS

RESULTS = "lm_eval.json"


def main(argv):
  del argv
  cli.setup()
  try:
    from sdm_jax.evaluation import harness
  except ImportError as error:
    raise app.UsageError(f"lm_eval cannot be imported ({error}); install the extra: pip install -e \".[eval]\"") \
        from None
  from lm_eval.utils import handle_non_serializable, make_table

  from sdm_jax import jsonio
  from sdm_jax.training.loop import load_config, restore_for_eval
  config = load_config(FLAGS.workdir)
  try:
    encode, decode, eot_id = harness.run_codec(config.data)
    tasks, task_manager = harness.resolve_tasks(FLAGS.tasks)
  except ValueError as error:
    raise app.UsageError(f"--{error}" if str(error).startswith("tasks:") else f"the run's {error}") from None
  model, step, _ = restore_for_eval(FLAGS.workdir, config)
  lm = harness.HarnessLM(model, encode, decode, eot_id, max_length=FLAGS.max_length or config.data.seq_len,
                         batch_size=FLAGS.batch_size)
  results = harness.evaluate_tasks(lm, tasks, task_manager, limit=FLAGS.limit, num_fewshot=FLAGS.num_fewshot,
                                   bootstrap_iters=FLAGS.bootstrap_iters)
  record = {"step": step, "tasks": FLAGS.tasks, "limit": FLAGS.limit,
            **{key: results.get(key) for key in ("results", "versions", "n-shot", "higher_is_better", "n-samples")}}
  path = pathlib.Path(FLAGS.workdir) / RESULTS
  jsonio.replace_text(path, jsonio.dumps(record, indent=2, default=handle_non_serializable) + "\n")
  print(make_table(results))
  print(f"step {step} -> {path}", flush=True)


if __name__ == "__main__":
  cli.run(main)
