"""JSON that every reader accepts: non-finite numbers become null (json.dumps would write NaN and Infinity,
which are not JSON), NumPy scalars become Python numbers; and files written whole or not at all."""

import json
import math
import numbers
import os
import pathlib
import tempfile


def finite(value):
  """`value` with every non-finite float (nan, inf) replaced by None, through dicts, lists and tuples."""
  if isinstance(value, dict):
    return {key: finite(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [finite(item) for item in value]
  if isinstance(value, bool) or value is None or isinstance(value, str):
    return value
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    value = float(value)
    return value if math.isfinite(value) else None
  return value


def dumps(value, **kwargs):
  """json.dumps of finite(value); raises ValueError rather than write a non-finite number."""
  return json.dumps(finite(value), allow_nan=False, **kwargs)


def replace_text(path, text):
  """Writes `text` to `path` whole or not at all: through a temporary file of its own in the same directory (so
  that writers of one file at the same time, e.g. the shards of a sweep, do not take each other's away), then a
  rename over `path`."""
  path = pathlib.Path(path)
  handle, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
  os.fchmod(handle, 0o644)
  with os.fdopen(handle, "w") as f:
    f.write(text)
  os.replace(partial, path)
