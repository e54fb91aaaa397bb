"""The one markdown table writer (sdm_jax/tables.py): how a cell writes each kind of value, the table's layout, and
that no other module of the repository writes a markdown table of its own; the kernel lists of a benchmark report
(sdm_jax/benchmarking/tables.py)."""

import pathlib

import sdm_jax.tables
from sdm_jax.benchmarking import tables
from sdm_jax.benchmarking.tables import kernel_section
from sdm_jax.tables import Column, cell, table

ROOT = pathlib.Path(__file__).resolve().parents[2]
WRITER = pathlib.Path(sdm_jax.tables.__file__).resolve()


def test_a_cell_writes_none_tuples_text_and_numbers():
  assert cell(None) == "-" and cell(None, ".3f", suffix="x") == "-"
  assert cell("fla safe_gate") == "fla safe_gate" and cell(True) == "True"
  assert cell(1234567) == "1,234,567" and cell(2.0) == "2" and cell(0.000123456) == "0.0001235"
  assert cell(1.23456, ".2f", suffix="x") == "1.23x" and cell(3 * 2**20, ".3f", 2**20) == "3.000"
  assert cell(0.4321, ".1%") == "43.2%" and cell(16, "d") == "16"
  assert cell((1.5, None), ".3f") == "1.500 / -" and cell(("pallas C32", None)) == "pallas C32 / -"
  assert cell([[16, 4], [16, 2]]) == "[[16, 4], [16, 2]]"


def test_a_table_has_a_header_a_rule_and_a_row_per_record():
  columns = [Column("mixer", "mixer"), Column("B x T", lambda r: f"{r['B']}x{r['T']}"),
             Column("fwd ms", "fwd_ms", ".3f"), Column("Mtok/s", "tokens_per_s", ".2f", 1e6)]
  records = [{"mixer": "kda", "B": 2, "T": 64, "fwd_ms": 1.25, "tokens_per_s": 2.5e6}, {"mixer": "gdn", "B": 1, "T": 8}]
  assert table(columns, records).splitlines() == ["| mixer | B x T | fwd ms | Mtok/s |", "|---|---|---|---|",
                                                  "| kda | 2x64 | 1.250 | 2.50 |", "| gdn | 1x8 | - | - |"]
  assert table(columns, []) == "| mixer | B x T | fwd ms | Mtok/s |\n|---|---|---|---|"


def test_kernel_section_lists_each_records_kernels_in_field_order():
  summary = lambda ms: {"total_ms": ms, "kernels": 1, "top": [("fusion", ms)]}
  records = [{"what": "a", "fwd": summary(1.0), "bwd": summary(2.0)}, {"what": "b", "fwd": None}]
  text = kernel_section(records, lambda r: r["what"], {"fwd": "forward", "bwd": "backward"})
  assert text.splitlines() == ["", "", tables.KERNELS_TITLE, "", "- a forward: 1.000 ms in 1 distinct kernels",
                               "  - 1.000 ms `fusion`", "- a backward: 2.000 ms in 1 distinct kernels",
                               "  - 2.000 ms `fusion`"]
  assert kernel_section(records[1:], lambda r: r["what"], {"fwd": "forward"}) == ""


def writes_a_table(text):
  """Whether Python source writes a markdown table by hand: a rule row, or cells joined into a row."""
  return "|---" in text or '" | ".join' in text


def test_every_markdown_table_comes_from_the_one_writer():
  """The package, the kernels, the experiments and the benchmark scripts build Columns and call `table`; only the
  writer itself writes a rule row or joins cells."""
  sources = sorted(path.resolve() for folder in ("sdm_jax", "pallas_kernels", "experiments", "benchmarks")
                   for path in (ROOT / folder).rglob("*.py"))
  assert WRITER in sources and writes_a_table(WRITER.read_text())
  writers = [str(path.relative_to(ROOT)) for path in sources if path != WRITER and writes_a_table(path.read_text())]
  assert writers == []
