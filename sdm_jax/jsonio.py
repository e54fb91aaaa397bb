"""JSON that every reader accepts: non-finite numbers become null (json.dumps would write NaN and Infinity,
which are not JSON), NumPy scalars become Python numbers."""

import json
import math
import numbers


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
