"""What every experiment script does first with its absl flags."""

from absl import flags, logging


def setup(cpu_defaults=None):
  """Logs at WARNING unless --verbosity is given (JAX's and orbax's INFO lines would bury the
  progress lines), and on a CPU backend gives every flag of cpu_defaults that was not passed its
  smaller CPU value (this starts JAX's backend: set its environment before)."""
  FLAGS = flags.FLAGS
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  if cpu_defaults:
    import jax
    if jax.default_backend() == "cpu":
      for name, value in cpu_defaults.items():
        if not FLAGS[name].present:
          FLAGS[name].value = value
