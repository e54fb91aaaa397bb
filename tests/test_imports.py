"""No file under tests/ imports a test module (test_*.py, conftest.py): what tests share lives in sdm_jax/testing
(inputs, error measures and tolerances, the lowering check) or in a helper module beside them (*_helpers.py), so a
test module's names are its own and each file runs alone."""

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent


def imported_test_modules(path, tests):
  """[(line, module name)] of the imports in `path` that name a test module under `tests`.

  A test module is reached by its dotted name from the repository root (tests.ops.test_x), by its bare name (pytest
  puts every test directory on sys.path) or relatively; imports inside functions count too.
  """
  stems = {p.stem for p in tests.rglob("*.py") if p.name.startswith("test_") or p.name == "conftest.py"}

  def names_one(name, relative):
    parts = name.split(".")
    if relative:
      return bool(set(parts) & stems)
    return parts[0] in stems or (parts[0] == tests.name and bool(set(parts[1:]) & stems))

  found = []
  for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
    if isinstance(node, ast.Import):
      found += [(node.lineno, alias.name) for alias in node.names if names_one(alias.name, False)]
    elif isinstance(node, ast.ImportFrom):
      dots, base = "." * node.level, node.module or ""
      if base and names_one(base, node.level > 0):
        found.append((node.lineno, dots + base))
        continue
      # `from tests.ops import test_x` and `from . import test_x` name the module in the alias.
      for alias in node.names:
        name = f"{base}.{alias.name}" if base else alias.name
        if names_one(name, node.level > 0):
          found.append((node.lineno, dots + name))
  return sorted(found)


def test_the_check_finds_each_way_of_importing_a_test_module(tmp_path):
  tests = tmp_path / "tests"
  (tests / "ops").mkdir(parents=True)
  (tests / "layers").mkdir()
  (tests / "conftest.py").write_text("")
  (tests / "layers" / "test_delta.py").write_text("GATE_WIDTHS = {}\n")
  (tests / "ops" / "ops_helpers.py").write_text("import numpy\n")
  (tests / "ops" / "test_clean.py").write_text(
      "import numpy as np\nfrom ops_helpers import x\nfrom jax._src import test_util\n")
  (tests / "ops" / "test_bad.py").write_text(
      "from test_delta import GATE_WIDTHS\n"
      "import tests.layers.test_delta\n"
      "from tests.layers import test_delta\n"
      "from .test_delta import GATE_WIDTHS\n"
      "def f():\n  from conftest import x\n")
  assert imported_test_modules(tests / "ops" / "test_clean.py", tests) == []
  assert imported_test_modules(tests / "ops" / "test_bad.py", tests) == [
      (1, "test_delta"), (2, "tests.layers.test_delta"), (3, "tests.layers.test_delta"), (4, ".test_delta"),
      (6, "conftest")]


def test_no_test_module_imports_another():
  found = {str(path.relative_to(TESTS.parent)): imported_test_modules(path, TESTS) for path in TESTS.rglob("*.py")}
  found = {path: imports for path, imports in sorted(found.items()) if imports}
  assert not found, f"test modules imported (share through sdm_jax/testing or a *_helpers.py module): {found}"
