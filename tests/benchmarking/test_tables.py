"""The one table writer of the benchmark reports (sdm_jax/benchmarking/tables.py): how a cell writes each kind of
value, the table's layout, the kernel lists, and that no other module writes a markdown table of its own."""

import pathlib

from sdm_jax.benchmarking import tables
from sdm_jax.benchmarking.tables import Column, cell, kernel_section, table

PACKAGE = pathlib.Path(tables.__file__).parent


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


def test_every_report_table_comes_from_the_one_writer():
  """A markdown table's rule row is written in tables.py alone: every mode's module builds Columns instead."""
  writers = [path.name for path in sorted(PACKAGE.glob("*.py"))
             if path.name != "tables.py" and "|---" in path.read_text()]
  assert writers == []
