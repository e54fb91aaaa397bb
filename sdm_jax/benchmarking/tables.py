"""The markdown of every report: one table writer (`table`: columns, records, numbers written by `cell`), the kernel
lists of a breakdown (`kernel_section`) and the report's two files (`write_tables`)."""

import dataclasses
import json
import numbers
import os
from typing import Any, Callable, Optional, Union

from sdm_jax import jsonio

KERNELS_TITLE = "## Kernels (CUPTI, one warm run, same-named kernels summed)"
NO_KERNELS = "- breakdown: no kernel list, CUPTI is not available on this backend"


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


def format_kernels(label, summary, width=100):
  """Markdown lines listing one `timing.kernel_summary` under `label`."""
  lines = [f"- {label}: {summary['total_ms']:.3f} ms in {summary['kernels']} distinct kernels"]
  return lines + [f"  - {ms:.3f} ms `{name[:width]}`" for name, ms in summary["top"]]


def kernel_section(records, name, fields, title=KERNELS_TITLE):
  """The kernel lists of the records that have them, under `title` ("" where none has): each field of `fields`
  ({record field holding a `timing.kernel_summary`: what it timed}) of each record, labelled 'name(record) what'."""
  lines = [line for r in records for field, what in fields.items() if r.get(field)
           for line in format_kernels(f"{name(r)} {what}", r[field])]
  return f"\n\n{title}\n\n" + "\n".join(lines) if lines else ""


def write_tables(records, meta, out_dir, tag, title, notes, body):
  """Writes <out_dir>/<date>_<tag>.json ({**meta, "results": records}) and .md (title, the run's date, device, jax
  version, command and config, `notes` lines, then `body`: the tables).

  Returns {"json", "md", "png"}: the paths of the report, the plot's for the caller to draw.
  """
  os.makedirs(out_dir, exist_ok=True)
  base = os.path.join(out_dir, f"{meta['date'][:10]}_{tag}")
  paths = {ext: f"{base}.{ext}" for ext in ("json", "md", "png")}
  with open(paths["json"], "w") as f:
    f.write(jsonio.dumps({**meta, "results": records}, indent=2))
  header = [f"# {title}: {tag}", ""]
  header += [f"- {key}: `{meta[key]}`" for key in ("date", "device", "jax_version", "timer", "command") if key in meta]
  header += [f"- config: `{json.dumps(meta['config'])}`"] + list(notes) + [""]
  with open(paths["md"], "w") as f:
    f.write("\n".join(header) + "\n" + body + "\n")
  return paths
