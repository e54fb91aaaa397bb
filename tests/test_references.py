"""Every repository path and DESIGN.md section the code and docs cite resolves, and no work-log numbering is left.

Read: every tracked .py file, README.md, docs/DESIGN.md and the current records (benchmarks/**/README.md). A path
under benchmarks/, docs/, sdm_jax/, tests/, experiments/ or pallas_kernels/ must exist; a dated result file a
record names (`2026-12-07_x.json`) must exist beside that record (the verbatim history under benchmarks/history/ is
not read); "DESIGN.md section N" must be a `## N.` heading of docs/DESIGN.md. The code and DESIGN.md state rules, not history: neither says "session <number>" nor cites
benchmarks/history/ (a measured reason cites the current record, `benchmarks/<area>/README.md`).
"""

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DESIGN = "docs/DESIGN.md"
PATH = re.compile(r"(?<![\w./-])((?:benchmarks|docs|sdm_jax|tests|experiments|pallas_kernels)/[\w./-]*)")
PLACEHOLDER = re.compile(r"(?<![\w./-])(?:benchmarks|docs|sdm_jax|tests|experiments|pallas_kernels)/[\w./-]*[<{*]")
# "DESIGN.md section 5", "DESIGN.md sections 3 and 9", across a comment's line break.
SECTION = re.compile(r"DESIGN\.md[\s#\",]*sections?\s+(\d+)(?:\s+and\s+(\d+))?")
RESULT_FILE = re.compile(r"(?<![\w./-])(20\d\d-\d\d-\d\d_[\w.-]*\.(?:json|md|png|txt|csv))\b")
SESSION = re.compile(r"\b[Ss]ession \d+|\bsessions \d+")


def _tracked(*patterns):
  out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True).stdout
  return [name for name in out.split() if (ROOT / name).is_file()]


def _cited_files():
  records = [name for name in _tracked("benchmarks/**/README.md") if not name.startswith("benchmarks/history/")]
  return _tracked("*.py", "README.md", DESIGN) + _tracked("benchmarks/README.md") + records


def _line(text, index):
  return text.count("\n", 0, index) + 1


@pytest.fixture(scope="module")
def texts():
  return {name: (ROOT / name).read_text(encoding="utf-8") for name in _cited_files()}


def test_cited_paths_exist(texts):
  missing = []
  for name, text in texts.items():
    for match in PATH.finditer(text):
      if PLACEHOLDER.match(text, match.start()):
        continue  # a pattern (benchmarks/<area>/README.md), not one file
      path = match.group(1).rstrip(".,;:)")
      if path and not (ROOT / path).exists() and not list(ROOT.glob(path + ".*")):  # an --out prefix: its files
        missing.append(f"{name}:{_line(text, match.start())}: {path}")
  assert not missing, "cited paths that do not exist:\n" + "\n".join(missing)


def test_result_files_named_by_a_record_exist(texts):
  missing = []
  for name, text in texts.items():
    if not name.startswith("benchmarks/"):
      continue
    folder = (ROOT / name).parent
    for match in RESULT_FILE.finditer(text):
      if not (folder / match.group(1)).exists():
        missing.append(f"{name}:{_line(text, match.start())}: {match.group(1)}")
  assert not missing, "result files a record names that are not beside it:\n" + "\n".join(missing)


def test_cited_design_sections_exist(texts):
  headings = set(re.findall(r"^## (\d+)\.", texts[DESIGN], re.M))
  assert headings, f"{DESIGN} has no '## N.' headings"
  unknown = []
  for name, text in texts.items():
    for match in SECTION.finditer(text):
      unknown += [f"{name}:{_line(text, match.start())}: section {n}" for n in match.groups() if n and n not in headings]
  assert not unknown, f"sections of {DESIGN} that do not exist:\n" + "\n".join(unknown)


def test_code_and_design_state_no_history(texts):
  found = []
  for name, text in texts.items():
    if (name.endswith(".py") and name != "tests/test_references.py") or name == DESIGN:  # not this file's own examples
      for pattern in (SESSION, re.compile(r"benchmarks/(?:history|sessions)/"), re.compile(r"\bSPEC\b")):
        found += [f"{name}:{_line(text, m.start())}: {m.group(0)}" for m in pattern.finditer(text)]
  assert not found, "work-log numbering or history cited in the code or DESIGN.md:\n" + "\n".join(found)


def test_the_checks_catch_what_they_look_for():
  assert PATH.findall("see benchmarks/ops/README.md.") == ["benchmarks/ops/README.md."]
  assert SECTION.findall("(DESIGN.md\n  # section 9)") == [("9", "")]
  assert SECTION.findall("DESIGN.md sections 3 and 9") == [("3", "9")]
  assert SESSION.search("as in session 24") and not SESSION.search('scope="session"')
  assert RESULT_FILE.findall("`2026-12-07_h100_x.{md,json}`, 2026-12-07_issue49_probe.json") == [
      "2026-12-07_issue49_probe.json"]
