r"""The one benchmark entry point: times a mode of the registry (sdm_jax/benchmarking/registry.py) and writes its
report, <out_dir>/<date>_<tag>.{json,md[,png]} (default runs/bench/, untracked: copy a report that matters into
benchmarks/ with its record).

  python -m experiments.bench --list                                   # every mode, what it times, its settings
  python -m experiments.bench --what=ops --mixers=kda,gdn2 --impls=pallas --shapes=4x4096 --set=chunk_size=32
  python -m experiments.bench --what=ops --mixers=gdn2 --shapes=4x4096 --base=HEAD~3   # that commit beside this tree
  python -m experiments.bench --what=ops --merge='runs/bench/*_ops_a.json,b.json' --tag=kda   # runs split over calls

--mixers, --impls, --shapes and --reps set the mode's setting of that name; --set=name=value sets any setting (a
list comma-separated; repeat --set for more). On a CPU backend a mode's sizes shrink to its CPU values unless set.
Exit codes: 0 every entry measured, 2 a bad flag, setting or report to merge, 3 the report was written but some
entries failed (out of memory, a crashed process: each error is in the report).
"""

import glob
import json
import pathlib
import sys

from absl import flags

from experiments import cli
from sdm_jax.benchmarking import registry, trees

flags.DEFINE_string("what", None, f"What to time, one of {tuple(registry.MODES)} (--list says what each times).")
flags.DEFINE_boolean("list", False, "Print the registry (every mode, what it times, its settings) and exit.")
flags.DEFINE_list("mixers", None, "The mode's `mixers` setting.")
flags.DEFINE_list("impls", None, "The mode's `impls` setting.")
flags.DEFINE_list("shapes", None, "The mode's `shapes` setting, BxT each.")
flags.DEFINE_integer("reps", None, "The mode's `reps` setting.")
flags.DEFINE_multi_string("set", [], "name=value: a setting of the mode (--list names them); repeatable.")
flags.DEFINE_string("base", None, "A git commit to time beside this tree in the same run (this tree's harness laid "
                    "over it, each tree in a process of its own); one report holds both trees' rows.")
flags.DEFINE_list("merge", [], "Instead of timing: the JSON reports of earlier runs of --what, written as one report "
                  "(each a path or a glob, quoted: its matches in order).")
flags.DEFINE_string("out_dir", "runs/bench", "Where the reports go (untracked: copy a report that matters into "
                    "benchmarks/ with its record).")
flags.DEFINE_string("tag", None, "File name tag, <out_dir>/<date>_<tag>.* (default: the mode's name).")
FLAGS = flags.FLAGS


def overrides():
  """The mode's settings given on the command line, as registry "name=value" strings (--set last: it wins)."""
  named = []
  for name in ("mixers", "impls", "shapes", "reps"):
    value = FLAGS[name].value
    if value is not None:
      named.append(f"{name}={','.join(value) if isinstance(value, list) else value}")
  return named + FLAGS.set


def main(argv):
  del argv
  cli.setup()
  if FLAGS.list:
    print(registry.describe())
    return
  merge = [path for pattern in FLAGS.merge for path in sorted(glob.glob(pattern)) or [pattern]]
  try:
    paths = registry.bench(FLAGS.what, overrides(), out_dir=FLAGS.out_dir, tag=FLAGS.tag, base=FLAGS.base,
                           merge=merge, log=lambda line: print(line, flush=True))
  except ValueError as error:
    if not FLAGS.merge:
      raise
    cli.fail(error)  # a report to merge that is missing or not one
  failed = failed_entries(paths)
  if failed:
    print(f"error: {len(failed)} entr{'y' if len(failed) == 1 else 'ies'} of the report failed ({failed[0]}"
          f"{', ...' if len(failed) > 1 else ''}); the report {paths['json']} holds each error", file=sys.stderr,
          flush=True)
    sys.exit(trees.FAILED_ENTRIES_EXIT)


def failed_entries(paths):
  """'name: error' of each entry of a written report that holds an error (out of memory, a failed process)."""
  try:
    results = json.loads(pathlib.Path(paths["json"]).read_text())["results"]
  except (TypeError, KeyError, OSError, ValueError):
    return []
  return [f"{entry.get('name') or entry.get('mixer') or entry.get('entry') or '?'}: "
          f"{str(entry['error']).strip().splitlines()[-1][:200]}"
          for entry in results if isinstance(entry, dict) and entry.get("error")]


if __name__ == "__main__":
  cli.run(main)
