"""Every command block of README.md runs as written (issue 52), so an example that breaks fails the tests.

A README section (a `## ` heading and its `### ` parts) is one test: its command blocks run in order, in a fresh
directory that holds links to this checkout's `experiments/` and `.venv/`, so every path a command names is one an
earlier command of the section created, never a placeholder. A command line ending in `# GPU-sized (...); CPU:
<flags>` runs with those flags put in place of the line's own (a flag of the same name replaced, a new one
appended): the README's own CPU equivalent, and the only way a command is shrunk. An indented block of Python (its
first line an import) runs with the interpreter. `make <target>` lines are checked with `make -n` (the demo and the
test suite itself take minutes; tests/experiments/test_train_cli.py and the suite cover what the demo runs). A line
marked `# needs the network` (the harness downloading its tasks) is the one kind left out, and only for
experiments.lm_eval.
"""

import os
import pathlib
import re
import shlex
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GPU_SIZED = re.compile(r"^GPU-sized\b.*;\s*CPU:\s*(?P<flags>--\S.*)$")
NEEDS_NETWORK = "needs the network"
TIMEOUT_S = 600


def _comment_start(line):
  """The index of a shell comment's `#` in line (outside quotes, after a blank), or None."""
  quote = None
  for index, character in enumerate(line):
    if quote:
      quote = None if character == quote else quote
    elif character in "'\"":
      quote = character
    elif character == "#" and (index == 0 or line[index - 1].isspace()):
      return index
  return None


def sections(text=None):
  """{section title: [block, ...]}, a block being the lines of one indented code block (4 spaces removed)."""
  found, title, block = {}, None, None
  for line in (README.read_text() if text is None else text).splitlines() + ["end"]:
    if line.startswith("    "):
      block = (block or []) + [line[4:]]
      continue
    if block is not None and not line.strip():
      block.append("")
      continue
    if block is not None:
      while not block[-1].strip():
        block.pop()
      found.setdefault(title, []).append(block)
      block = None
    if line.startswith("## "):
      title = line[3:].strip()
  return found


def commands(block):
  """(command, comment) per command of a shell block: backslash continuations joined, the comment split off."""
  joined, current = [], ""
  for line in block:
    if not line.strip():
      continue
    if line.rstrip().endswith("\\"):
      current += line.rstrip()[:-1].strip() + " "
      continue
    joined.append(current + line.strip())
    current = ""
  result = []
  for line in joined:
    start = _comment_start(line)
    command, comment = (line, "") if start is None else (line[:start].strip(), line[start + 1:].strip())
    result.append((command, comment))
  return result


def _flag_name(word):
  """'--config.train.steps=3' -> 'config.train.steps'; '--set=remat=none' -> 'set=remat' (--set is repeated)."""
  name, _, value = word[2:].partition("=")
  return f"set={value.partition('=')[0]}" if name == "set" else name


def with_cpu_flags(command, flags):
  """command with each --flag of `flags` in place of the command's flag of that name, or appended."""
  words, replacements = shlex.split(command), shlex.split(flags)
  for flag in replacements:
    if not flag.startswith("--"):
      raise ValueError(f"CPU: expected --flag=value words, got {flag!r} in {flags!r}")
    names = [_flag_name(word) if word.startswith("--") else None for word in words]
    if _flag_name(flag) in names:
      words[names.index(_flag_name(flag))] = flag
    else:
      words.append(flag)
  return shlex.join(words)


def runnable(block):
  """What to run for one block: ("python", code) for a Python block, else ("shell", [command, ...]) with every
  GPU-sized command given its CPU flags and the lines that need the network left out."""
  if block[0].startswith(("import ", "from ")):
    return "python", "\n".join(block)
  run = []
  for command, comment in commands(block):
    gpu = GPU_SIZED.match(comment)
    if comment.startswith("GPU-sized") and not gpu:
      raise ValueError(f"a GPU-sized line must end in '; CPU: <flags>': {command}  # {comment}")
    if comment.startswith(NEEDS_NETWORK):
      if "experiments.lm_eval" not in command:
        raise ValueError(f"only the harness's downloads may skip a line: {command}")
      continue
    run.append(with_cpu_flags(command, gpu.group("flags")) if gpu else command)
  return "shell", run


def _environment():
  # The suite's compilation cache, with every program however short its compilation, comes from tests/conftest.py.
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  # The suite turns LLVM's optimisations off for its tiny programs; these commands run tens of steps of delta-rule
  # models, which that makes slower than it makes their compilation faster.
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace("--xla_backend_optimization_level=0", "").strip()
  return env


def test_the_readme_splits_into_its_command_blocks():
  text = ("## A\n\n    make demo    # x\n\n    a \\\n        --b='c # d'   # e\n    f\n\ntext\n\n    g\n"
          "## B\n\n    import os\n")
  found = sections(text)
  assert list(found) == ["A", "B"] and len(found["A"]) == 2
  assert commands(found["A"][0]) == [("make demo", "x"), ("a --b='c # d'", "e"), ("f", "")]
  assert runnable(found["B"][0]) == ("python", "import os")
  assert with_cpu_flags("x --config=a.py:gpu --set=remat=none,dots --workdir=w",
                        "--config=a.py:cpu --set=remat=none --seeds=1") == \
      "x --config=a.py:cpu --set=remat=none --workdir=w --seeds=1"


def test_every_gpu_sized_line_gives_cpu_flags_and_no_command_holds_a_placeholder():
  lines = [(title, command, comment) for title, blocks in sections().items() for block in blocks
           if not block[0].startswith(("import ", "from ")) for command, comment in commands(block)]
  assert len(lines) >= 20
  gpu = [(command, comment) for _, command, comment in lines if "GPU-sized" in comment]
  assert gpu and all(GPU_SIZED.match(comment) for _, comment in gpu), gpu
  for command, comment in gpu:  # the CPU flags change the command
    assert with_cpu_flags(command, GPU_SIZED.match(comment).group("flags")) != shlex.join(shlex.split(command))
  placeholders = [command for _, command, _ in lines if re.search(r"\.\.\.|path/to|<\w+>|\bx\.json\b", command)]
  assert placeholders == []


@pytest.mark.parametrize("title", [title for title in sections() if title])
def test_the_readme_section_runs(title, tmp_path):
  for name in ("experiments", ".venv"):
    (tmp_path / name).symlink_to(ROOT / name)
  env = _environment()
  for block in sections()[title]:
    kind, what = runnable(block)
    if kind == "python":
      done = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", what], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=TIMEOUT_S)
      assert done.returncode == 0, f"{title}: the Python block failed:\n{what}\n{done.stderr[-3000:]}"
      continue
    for command in what:
      if command.startswith("make "):
        done = subprocess.run(["make", "-n", *shlex.split(command)[1:]], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
      else:
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
      assert done.returncode == 0, f"{title}: {command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
