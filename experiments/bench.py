r"""The one benchmark entry point: times a mode of the registry (sdm_jax/benchmarking/registry.py) and writes its
report, <out_dir>/<date>_<tag>.{json,md[,png]} (default runs/bench/, untracked: copy a report that matters into
benchmarks/ with its record).

  python -m experiments.bench --list                                   # every mode, what it times, its settings
  python -m experiments.bench --what=ops --mixers=kda,gdn2 --impls=pallas --shapes=4x4096 --set=chunk_size=32
  python -m experiments.bench --what=ops --mixers=gdn2 --shapes=4x4096 --base=HEAD~3   # that commit beside this tree
  python -m experiments.bench --what=ops --merge=a.json,b.json --tag=kda   # one report from runs split over calls

--mixers, --impls, --shapes and --reps set the mode's setting of that name; --set=name=value sets any setting (a
list comma-separated; repeat --set for more). On a CPU backend a mode's sizes shrink to its CPU values unless set.
"""

from absl import flags

from experiments import cli
from sdm_jax.benchmarking import registry

flags.DEFINE_string("what", None, f"What to time, one of {tuple(registry.MODES)} (--list says what each times).")
flags.DEFINE_boolean("list", False, "Print the registry (every mode, what it times, its settings) and exit.")
flags.DEFINE_list("mixers", None, "The mode's `mixers` setting.")
flags.DEFINE_list("impls", None, "The mode's `impls` setting.")
flags.DEFINE_list("shapes", None, "The mode's `shapes` setting, BxT each.")
flags.DEFINE_integer("reps", None, "The mode's `reps` setting.")
flags.DEFINE_multi_string("set", [], "name=value: a setting of the mode (--list names them); repeatable.")
flags.DEFINE_string("base", None, "A git commit to time beside this tree in the same run (this tree's harness laid "
                    "over it, each tree in a process of its own); one report holds both trees' rows.")
flags.DEFINE_list("merge", [], "Instead of timing: the JSON reports of earlier runs of --what, written as one report.")
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
  registry.bench(FLAGS.what, overrides(), out_dir=FLAGS.out_dir, tag=FLAGS.tag, base=FLAGS.base, merge=FLAGS.merge,
                 log=lambda line: print(line, flush=True))


if __name__ == "__main__":
  cli.run(main)
