"""The one markdown table writer of the project's reports (benchmarks, sweep and run summaries, the recall protocol):
`table` writes columns over records, `cell` writes each value. It sits beside jsonio, below every package that
reports, so training, evaluation and benchmarking write their tables the same way."""

import dataclasses
import json
import numbers
from typing import Any, Callable, Optional, Union


@dataclasses.dataclass(frozen=True)
class Column:
  """One column of a table: its header, and what its cell holds for a record, value (the record's field of that
  name, or a function of the record) written by `cell(value, spec, scale, suffix)`."""
  header: str
  value: Union[str, Callable[[Any], Any]]
  spec: Optional[str] = None
  scale: float = 1
  suffix: str = ""


def cell(value, spec=None, scale=1, suffix=""):
  """A table cell: '-' for None; a tuple's values each written so and joined by ' / ' (fwd / fwd+bwd); text as it
  is; a number as format(value / scale, spec) + suffix, without spec an integer with thousands separators and any
  other number to 4 significant digits."""
  if value is None:
    return "-"
  if isinstance(value, tuple):
    return " / ".join(cell(v, spec, scale, suffix) for v in value)
  if isinstance(value, (str, bool)):
    return str(value)
  if not isinstance(value, numbers.Number):
    return json.dumps(value)
  value = value / scale if scale != 1 else value
  if spec is None:
    spec = "," if isinstance(value, numbers.Integral) else ".4g"
  return format(value, spec) + suffix


def table(columns, records):
  """A markdown table: a row of the columns' headers, then one row per record."""
  lines = ["| " + " | ".join(column.header for column in columns) + " |", "|" + "---|" * len(columns)]
  for r in records:
    values = [c.value(r) if callable(c.value) else r.get(c.value) for c in columns]
    lines.append("| " + " | ".join(cell(v, c.spec, c.scale, c.suffix) for v, c in zip(values, columns)) + " |")
  return "\n".join(lines)
