"""A run's config: the training fields and their defaults, the check a config passes before anything is written
to a workdir, and what may change between the calls of one run.

A run's config has four parts: seed, model (`sdm_jax.models.default_config`), data
(`sdm_jax.data.default_data_config(name)`) and train (`default_config` here).
"""

import difflib

import ml_collections

# The fields a resumed run may change. Everything else fixes what the run computes (the model, the data, the
# optimizer and its schedule, the seed): a resume that changes any of them is refused, and --overwrite is the one
# way to start afresh in a used workdir. These only change when things are logged, evaluated, saved or kept, how
# the host reads the data, and how the arrays are placed on the devices (train.fsdp; a checkpoint restores into
# the shardings of the run that reads it, on any number of devices), never the parameters a step produces. The
# device count is no config field: a run may resume on another mesh whose devices divide its global batch.
RESUMABLE_FIELDS = (
    "train.log_every", "train.eval_every", "train.eval_batches", "train.checkpoint_every", "train.keep_checkpoints",
    "train.fsdp", "train.wandb_project", "train.profile_steps", "data.num_threads", "data.prefetch_buffer_size",
)


class ConfigError(ValueError):
  """A config field that cannot run: the message names the field, what came and what was expected."""


def default_config(steps=1000, learning_rate=1e-3, *, warmup_steps=100, log_every=20, eval_every=200,
                   checkpoint_every=200):
  """The `train` sub-config: every field the loop and the optimizer read."""
  from sdm_jax.models.loss import LOSS_CHUNK_TOKENS
  train = ml_collections.ConfigDict()
  train.steps = steps
  train.learning_rate = learning_rate
  train.warmup_steps = warmup_steps
  train.final_lr_fraction = 0.1
  train.b1, train.b2 = 0.9, 0.95
  train.weight_decay = 0.1
  train.grad_clip = 1.0
  train.log_every = log_every
  train.eval_every = eval_every
  train.eval_batches = 4
  train.checkpoint_every = checkpoint_every
  train.keep_checkpoints = 3
  train.fsdp = False
  train.loss_chunk_tokens = LOSS_CHUNK_TOKENS
  # "cosine", "wsd" or "constant" (optimizer.make_schedule); decay_fraction: the share of steps wsd decays over.
  train.schedule = "cosine"
  train.decay_fraction = 0.2
  # Microbatches the global batch (data.batch_size rows) is split into inside one step, their gradients summed:
  # the step's loss and update are the whole batch's, in a microbatch's activation memory.
  train.gradient_accumulation_steps = 1
  # Also log to this Weights & Biases project when wandb is installed ("": not at all).
  train.wandb_project = ""
  # "FIRST,LAST" (or "STEP"): a jax.profiler trace of those training steps in <workdir>/profile ("": none).
  train.profile_steps = ""
  # Stop at the first evaluation whose accuracy reaches this (0: train every step): that step is the run's last, and
  # its steps-to-threshold (loop.final_step). Not resumable: a run's length must not depend on which call ran it.
  train.stop_at_accuracy = 0.0
  return train


def close_names(name, choices):
  """' (did you mean ...?)' with the choices closest to `name` (difflib), or '' when none is close."""
  close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=3, cutoff=0.6)
  return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def check_choice(field, value, choices):
  """ConfigError naming `field` unless value is one of choices."""
  if value not in choices:
    raise ConfigError(f"{field}: expected one of {tuple(choices)}, got {value!r}{close_names(value, choices)}")


def _check_fields(prefix, config, expected):
  unknown = sorted(set(config) - set(expected))
  if unknown:
    raise ConfigError(f"{prefix}.{unknown[0]}: no such field{close_names(unknown[0], expected)}; the fields of "
                      f"{prefix} are {sorted(expected)}")
  missing = sorted(set(expected) - set(config))
  if missing:
    raise ConfigError(f"{prefix}: missing the fields {missing}; start from its defaults")


def _check_data(data):
  """The data task's own check of its fields together (num_queries <= num_kv_pairs, a corpus's manifest)."""
  import re

  from sdm_jax.data.pipeline import check_data
  try:
    check_data(data)
  except ValueError as error:
    line = str(error).splitlines()[0]
    raise ConfigError(f"config.data.{line}" if re.match(r"\w+: ", line) else f"config.data: {line}") from None


def dotted_field(config, field):
  """(the ConfigDict that holds dotted `field`, e.g. "model.sdm.num_slots", and its last name), or None when no such
  field exists (a section is not a field)."""
  *parents, name = field.split(".")
  for parent in parents:
    config = config.get(parent) if hasattr(config, "keys") else None
  if not hasattr(config, "keys") or name not in config or hasattr(config[name], "keys"):
    return None
  return config, name


def _check_positive(config, fields):
  for field in fields:
    section, name = field.split(".")
    value = config[section][name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f"config.{field}: expected an integer >= 1, got {value!r}")


def _check_model(model, seq_len):
  """Builds the model and traces its forward on one sequence, abstractly (jax.eval_shape: nothing is allocated),
  so that every error its layers and ops raise at construction or at trace time comes here."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from sdm_jax.models import LanguageModel
  try:
    abstract = nnx.eval_shape(lambda: LanguageModel(model, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    jax.eval_shape(lambda s, t: nnx.merge(graphdef, s)(t), state, jax.ShapeDtypeStruct((1, seq_len), jnp.int32))
  except (ValueError, TypeError) as error:
    raise ConfigError(f"config.model: {str(error).splitlines()[0]}") from None


def check_config(config, *, device_count=1):
  """Raises ConfigError unless `config` can run: its fields are the known ones, its names are in their registries
  (mixers, impls, remat policies, dtypes, data tasks), the model builds and traces, the training fields are
  positive, and the global batch divides over `device_count` devices. Cheap: nothing runs and nothing is written.
  """
  from sdm_jax.data import TASKS, default_data_config
  from sdm_jax.models import default_config as default_model_config
  from sdm_jax.models.lm import DTYPES, REMAT_POLICIES
  from sdm_jax.ops import MIXERS
  from sdm_jax.ops import delta_rule, product_key, sparse_delta
  from sdm_jax.ops.validation import AUTO

  _check_fields("config", config, ("seed", "model", "data", "train"))
  check_choice("config.data.name", config.data.get("name"), tuple(TASKS))
  _check_fields("config.data", config.data, default_data_config(config.data.name))
  _check_fields("config.model", config.model, default_model_config())
  _check_fields("config.train", config.train, default_config())
  _check_data(config.data)
  model = config.model
  check_choice("config.model.mixer", model.mixer, tuple(MIXERS))
  check_choice("config.model.impl", model.impl, (AUTO, *delta_rule.IMPLEMENTATIONS))
  check_choice("config.model.sdm.impl", model.sdm.impl, (AUTO, *sparse_delta.IMPLEMENTATIONS))
  check_choice("config.model.sdm.address_impl", model.sdm.address_impl, (AUTO, *product_key.IMPLEMENTATIONS))
  check_choice("config.model.remat", model.remat, tuple(REMAT_POLICIES))
  check_choice("config.model.dtype", model.dtype, tuple(DTYPES))
  _check_positive(config, ("train.steps", "train.log_every", "train.eval_every", "train.eval_batches",
                           "train.checkpoint_every", "train.keep_checkpoints", "data.batch_size", "data.seq_len"))
  if config.data.vocab_size > model.vocab_size:
    raise ConfigError(f"config.model.vocab_size: the data has {config.data.vocab_size} tokens, more than the "
                      f"model's {model.vocab_size}")
  check_batch(config, device_count)
  _check_train(config.train, config.data.batch_size, device_count)
  _check_model(model, config.data.seq_len)


def parse_profile_steps(text):
  """train.profile_steps "FIRST,LAST" or "STEP" -> (first, last), or None for ""; ConfigError otherwise."""
  if not text:
    return None
  try:
    steps = [int(part) for part in str(text).split(",")]
  except ValueError:
    steps = []
  if len(steps) not in (1, 2) or steps[0] < 1 or steps[-1] < steps[0]:
    raise ConfigError(f"config.train.profile_steps: expected \"FIRST,LAST\" or \"STEP\", steps >= 1 and FIRST <= "
                      f"LAST (e.g. \"10,15\"), or \"\" for no profile, got {text!r}")
  return steps[0], steps[-1]


def _check_train(train, batch_size, device_count):
  from sdm_jax.training.optimizer import SCHEDULES
  check_choice("config.train.schedule", train.schedule, SCHEDULES)
  if isinstance(train.decay_fraction, bool) or not isinstance(train.decay_fraction, (int, float)) \
      or not 0 < train.decay_fraction <= 1:
    raise ConfigError(f"config.train.decay_fraction: expected a number in (0, 1], got {train.decay_fraction!r}")
  accumulation = train.gradient_accumulation_steps
  if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
    raise ConfigError(f"config.train.gradient_accumulation_steps: expected an integer >= 1, got {accumulation!r}")
  if batch_size % (accumulation * device_count):
    raise ConfigError(f"config.train.gradient_accumulation_steps: the global batch {batch_size} does not split "
                      f"into {accumulation} microbatches that each divide over {device_count} device(s); use a "
                      f"divisor of {batch_size // device_count}")
  if not isinstance(train.wandb_project, str):
    raise ConfigError(f"config.train.wandb_project: expected a project name or \"\", got {train.wandb_project!r}")
  parse_profile_steps(train.profile_steps)
  target = train.stop_at_accuracy
  if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 <= target <= 1:
    raise ConfigError(f"config.train.stop_at_accuracy: expected an accuracy in (0, 1], or 0 to train every step, "
                      f"got {target!r}")


def check_batch(config, device_count):
  """ConfigError unless the global batch divides over `device_count` devices (the data-parallel mesh)."""
  if config.data.batch_size % device_count:
    raise ConfigError(f"config.data.batch_size: the global batch {config.data.batch_size} does not divide over "
                      f"{device_count} devices; use a multiple of {device_count}")


def _flatten(config, prefix=""):
  flat = {}
  for key, value in config.items():
    name = f"{prefix}{key}"
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      flat.update(_flatten(value, name + "."))
    else:
      flat[name] = list(value) if isinstance(value, tuple) else value
  return flat


def _defaults(config):
  """The flattened defaults of a config's parts (model, train, and data when its task is known)."""
  from sdm_jax.data import TASKS, default_data_config
  from sdm_jax.models import default_config as default_model_config
  defaults = {"model": default_model_config(), "train": default_config()}
  name = config.get("data", {}).get("name")
  if name in TASKS:
    defaults["data"] = default_data_config(name)
  return _flatten(defaults)


def config_differences(old, new, *, ignore=RESUMABLE_FIELDS):
  """["field: old -> new", ...] for every field of two configs (ConfigDicts or dicts, as config.json stores them)
  that differs, fields in `ignore` left out. A field one of them lacks counts at its default (a config saved
  before the field existed), or as <missing> where it has none."""
  old, new = ({**_defaults(c), **_flatten(c)} for c in (old, new))
  lines = []
  for name in sorted(set(old) | set(new)):
    if name in ignore:
      continue
    a, b = old.get(name, "<missing>"), new.get(name, "<missing>")
    if a != b:
      lines.append(f"{name}: {a!r} -> {b!r}")
  return lines
