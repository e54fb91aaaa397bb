"""What every experiment script does with its absl flags: `run(main)` instead of app.run, `setup()` first in main.

A bad flag, config file or config field is one line on stderr, `error: <what> ...`, naming it (with the close
valid names where there are some), and exit code 2; nothing is run or written. --help prints the tool's docstring
and its flags and exits 0.
"""

import re
import signal
import sys

from absl import app, flags, logging

USAGE_EXIT = 2
HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml", "?")


def fail(message):
  """Prints `error: message` as one line on stderr and exits with USAGE_EXIT."""
  print("error: " + " ".join(str(message).split()), file=sys.stderr, flush=True)
  sys.exit(USAGE_EXIT)


def _last_line(text):
  """The last line of an error text that may hold a traceback, without its exception type."""
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  if not lines:
    return ""
  return re.sub(r"^[A-Za-z_][\w.]*(Error|Exception): ", "", lines[-1])


def _flag_error(error):
  """One line from absl's flag errors; config_flags puts the config file's whole traceback in its message."""
  text = str(error)
  if "Traceback" not in text:
    return text
  flag = re.match(r"flag (--.+?): ", text)
  return f"{flag.group(1) if flag else 'a flag'}: {_last_line(text)}"


def _override_error(error, argv):
  """One line for config_flags' KeyError / AttributeError on --config.<field>=... naming a missing field."""
  text = str(error)
  named = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
  missing = named.group(2) if named else (re.findall(r"\w+", text) or [""])[0]
  hint = f" (did you mean {named.group(1)!r}?)" if named else ""
  for arg in argv[1:]:
    name = arg.lstrip("-").split("=", 1)[0]
    parts = name.split(".")
    if missing in parts[1:]:
      return f"--{name}: {'.'.join(parts[:parts.index(missing, 1)])} has no field {missing!r}{hint}"
  return f"a config override names a field that does not exist: {missing!r}{hint}"


def _check_config_files(flag_values):
  """config_flags defers a config file that cannot be loaded until the config is read: read it here."""
  from ml_collections.config_flags import config_flags
  for name in flag_values:
    flag = flag_values[name]
    if not config_flags.is_config_flag(flag) or flag.value is None:
      continue
    try:
      flag.value.keys()
    except OSError:
      fail(f"--{name}={flag.config_filename}: cannot load that config file; expected path/to/config.py:variant")


def parse_flags(argv, flag_values=None):
  """absl's flag parsing with each error as one line (`fail`); returns the arguments left over."""
  flag_values = flags.FLAGS if flag_values is None else flag_values
  argv = [argv[0], *("--help" if arg == "-h" else arg for arg in argv[1:])]  # absl knows no -h
  try:
    remaining = flag_values(argv)
  except SystemExit as exit_:  # absl exits 1 after printing the help it was asked for
    if exit_.code == 1 and any(arg.lstrip("-").split("=")[0] in HELP_FLAGS for arg in argv[1:] if arg[:1] == "-"):
      sys.exit(0)
    raise
  except flags.Error as error:
    fail(_flag_error(error))
  except (AttributeError, KeyError) as error:  # config_flags on --config.<field> that does not exist
    fail(_override_error(error, argv))
  except Exception as error:  # a config file that raises on import or in get_config
    fail(f"{' '.join(argv[1:])}: {type(error).__name__}: {_last_line(error)}")
  _check_config_files(flag_values)
  return remaining


def usage_errors(main):
  """main, with the errors of a bad config, workdir or argument (app.UsageError, ValueErrors of those kinds) as
  one line and exit code 2, and a KeyboardInterrupt as exit code 130 without a traceback."""
  def guarded(argv):
    from sdm_jax.training.config import ConfigError
    from sdm_jax.training.workdir import WorkdirError
    try:
      return main(argv)
    except (app.UsageError, ConfigError, WorkdirError) as error:
      fail(error)
    except KeyboardInterrupt:  # before a program installs its own handling, or a second Ctrl-C after it
      print("interrupted", file=sys.stderr, flush=True)
      sys.exit(128 + signal.SIGINT)
  return guarded


def run(main):
  """app.run(main) with parse_flags and usage_errors."""
  app.run(usage_errors(main), flags_parser=parse_flags)


def setup():
  """Logs at WARNING unless --verbosity is given (JAX's and orbax's INFO lines would bury the
  progress lines). A benchmark's smaller CPU settings are the registry's (sdm_jax.benchmarking.registry)."""
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
