r"""Converts flash-linear-attention checkpoints to runs and back.

  .venv/bin/python -m experiments.convert --from_fla=<fla HF dir> --config=experiments/configs/paper.py:kda_340m \
      --out=runs/kda_340m_from_fla
  .venv/bin/python -m experiments.convert --to_fla=runs/kda_340m_from_fla --out=<fla HF dir>

--from_fla writes a run directory at step 0 whose model is the checkpoint (fla's GatedDeltaNetForCausalLM or
KDAForCausalLM, config.json + safetensors) and whose data and training come from --config (its model part is
replaced, keeping dtype, impl, chunk_size and remat): experiments.train resumes it (fine-tuning), experiments.eval
and experiments.generate read it. --to_fla writes the newest good checkpoint of a run as a directory that fla's
AutoModelForCausalLM.from_pretrained loads. Unknown, missing or mis-shaped tensors and config fields fla's models
cannot express are one-line errors naming them, exit 2. No torch is needed.
"""

from absl import app, flags
from ml_collections import config_flags

from experiments import cli

flags.DEFINE_string("from_fla", None, "An fla HF checkpoint directory to convert into a run.")
flags.DEFINE_string("to_fla", None, "A run directory to convert into an fla HF checkpoint.")
flags.DEFINE_string("out", None, "The directory to write (a run directory, or an fla checkpoint).", required=True)
config_flags.DEFINE_config_file("config", None, "With --from_fla: the run's config file, path.py:variant.",
                                lock_config=False)
flags.DEFINE_boolean("overwrite", False, "With --from_fla: replace a run already in --out.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup()
  if (FLAGS.from_fla is None) == (FLAGS.to_fla is None):
    raise app.UsageError("expected exactly one of --from_fla=<fla dir> or --to_fla=<run dir>")
  from sdm_jax.interop.runs import run_from_fla, run_to_fla
  from sdm_jax.training.workdir import absolute_paths
  try:
    if FLAGS.from_fla is not None:
      if FLAGS.config is None:
        raise app.UsageError("--from_fla needs --config=path.py:variant for the run's data and training")
      config = run_from_fla(FLAGS.from_fla, absolute_paths(FLAGS.config), FLAGS.out, overwrite=FLAGS.overwrite)
      print(f"wrote run {FLAGS.out} at step 0 ({config.model.mixer}, {config.model.num_layers} layers, width "
            f"{config.model.width}); train, eval and generate take --workdir={FLAGS.out}")
    else:
      step = run_to_fla(FLAGS.to_fla, FLAGS.out)
      print(f"wrote step {step} of {FLAGS.to_fla} as an fla checkpoint in {FLAGS.out}")
  except ValueError as error:
    cli.fail(error)


if __name__ == "__main__":
  cli.run(main)
