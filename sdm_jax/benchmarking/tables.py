"""The markdown of every benchmark report: its tables come from the one writer (sdm_jax/tables.py: `Column`, `cell`,
`table`, which the modes import from here), then the kernel lists of a breakdown (`kernel_section`) and the report's
two files (`write_tables`)."""

import json
import os

from sdm_jax import jsonio
from sdm_jax.tables import Column, cell, table  # noqa: F401 (the modes import the writer from here)

KERNELS_TITLE = "## Kernels (CUPTI, one warm run, same-named kernels summed)"
NO_KERNELS = "- breakdown: no kernel list, CUPTI is not available on this backend"


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
