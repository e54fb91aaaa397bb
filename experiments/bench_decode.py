r"""Decode tokens/s and cache memory per sequence of every mixer's language model at contexts 1K to 64K,
against a full-attention model of the same width, depth and heads (issue 6).

  python -m experiments.bench_decode                       # on a GPU: the defaults below
  python -m experiments.bench_decode --variants=gdn2,sdm,attention --batches=32 --contexts=4096,65536

The dense mixers are pattern "D" models, `sdm` is the configs' 3 SWA : 1 SDM hybrid ("SSSM"),
`attention` is pattern "A"; every model has --layers layers of --width, --heads heads of --head_dim.
--overrides sets any other model config field on every model (e.g. window=2048,dtype=bfloat16).
Writes <out_dir>/<date>_<tag>.{json,md,png} after every point and prints the short table last. On a
CPU backend the defaults shrink (contexts 64,256, width 64, 2 heads of 32, 8 steps, 2 reps) unless given.
"""

from absl import app, flags

from experiments import cli
from experiments.configs.common import MIXERS, VARIANTS, model_config
from sdm_jax.benchmarking.decode_bench import ATTENTION, format_table, run_sweep, write_report
from sdm_jax.benchmarking.timing import run_metadata
from sdm_jax.models import layer_letters

CHOICES = VARIANTS + (ATTENTION,)

flags.DEFINE_list("variants", [*MIXERS, "sdm", ATTENTION],
                  f"Models to time, from {CHOICES}.")
flags.DEFINE_list("batches", ["1", "32"], "Batch sizes.")
flags.DEFINE_list("contexts", ["1024", "4096", "16384", "65536"], "Tokens already in the cache when decoding starts.")
flags.DEFINE_integer("steps", 64, "Tokens decoded per timed run (one lax.scan).")
flags.DEFINE_integer("reps", 5, "Timed runs per point (median), after one warm-up.")
flags.DEFINE_integer("width", 512, "Model width.")
flags.DEFINE_integer("layers", 4, "Layers of every model (a hybrid's pattern repeats to fill them).")
flags.DEFINE_integer("heads", 8, "Heads of the dense mixers and attention.")
flags.DEFINE_integer("head_dim", 64, "Key and value dimension per head.")
flags.DEFINE_integer("vocab_size", 256, "Vocabulary size.")
flags.DEFINE_list("overrides", [], "field=value pairs set on every model config, e.g. window=2048,dtype=bfloat16.")
flags.DEFINE_integer("seed", 0, "Seed of the random parameters.")
flags.DEFINE_string("out_dir", "runs/bench", "Where the JSON, markdown and PNG go (untracked: copy a report that "
                    "matters into benchmarks/ with its record).")
flags.DEFINE_string("tag", "decode", "File name tag: <out_dir>/<date>_<tag>.*")
FLAGS = flags.FLAGS

CPU_DEFAULTS = {"contexts": ["64", "256"], "width": 64, "heads": 2, "head_dim": 32, "steps": 8, "reps": 2}


def model_configs(variants, *, vocab_size, width, num_layers, num_heads, head_dim, overrides=()):
  """{variant: its LanguageModel config}; every model gets the same width, layers and heads.

  overrides: "field=value" strings, each set on every config (the value converted to the field's type).
  """
  unknown = [v for v in variants if v not in CHOICES]
  if unknown or not variants:
    raise ValueError(f"variants: expected some of {CHOICES}, got {list(variants)}")
  configs = {}
  for variant in variants:
    # A full-attention model is any variant's config with every layer attention: the mixer goes unused.
    config = model_config(VARIANTS[0] if variant == ATTENTION else variant, vocab_size, width=width,
                          num_heads=num_heads, head_dim=head_dim)
    config.pattern = "A" if variant == ATTENTION else config.pattern
    config.num_layers = num_layers
    for item in overrides:
      _override(config, item)
    if set(layer_letters(config.pattern, num_layers)) != set(config.pattern):
      raise ValueError(f"layers: {variant}'s pattern {config.pattern!r} needs at least {len(config.pattern)} "
                       f"layers, got {num_layers}")
    configs[variant] = config
  return configs


def _override(config, item):
  field, _, value = item.partition("=")
  if field not in config or not value:
    raise ValueError(f"overrides: expected field=value with a field of {sorted(config)}, got {item!r}")
  config[field] = type(config[field])(value)


def _ints(name, values):
  try:
    return [int(v) for v in values]
  except ValueError:
    raise app.UsageError(f"--{name}: expected integers, got {values}") from None


def main(argv):
  del argv
  cli.setup(CPU_DEFAULTS)
  try:
    configs = model_configs(FLAGS.variants, vocab_size=FLAGS.vocab_size, width=FLAGS.width,
                            num_layers=FLAGS.layers, num_heads=FLAGS.heads, head_dim=FLAGS.head_dim,
                            overrides=FLAGS.overrides)
  except ValueError as error:
    raise app.UsageError(str(error)) from None
  batches, contexts = _ints("batches", FLAGS.batches), _ints("contexts", FLAGS.contexts)
  config = {name: FLAGS[name].value for name in ("variants", "steps", "reps", "width", "layers", "heads", "head_dim",
                                                  "vocab_size", "overrides", "seed")}
  config.update(batches=batches, contexts=contexts)
  meta = {**run_metadata(), "config": config, "model_configs": {name: c.to_dict() for name, c in configs.items()}}
  # The plot is redrawn once a (model, batch) has all its contexts; the JSON and markdown after every point.
  progress = lambda records: write_report(records, meta, FLAGS.out_dir, FLAGS.tag,
                                          plot=len(records) % len(contexts) == 0)
  records = run_sweep(configs, batches, contexts, steps=FLAGS.steps, reps=FLAGS.reps, seed=FLAGS.seed,
                      log=lambda line: print(line, flush=True), on_progress=progress)
  paths = write_report(records, meta, FLAGS.out_dir, FLAGS.tag)
  print("\nwrote " + ", ".join(paths.values()))
  print(f"\n{meta['device']}; vs attention = attention ms/step / ours\n" + format_table(records))


if __name__ == "__main__":
  cli.run(main)
