r"""Times whole-model training steps of our language model and, in the same device call, fla's HF models.

  python -m experiments.bench_train --configs=experiments/configs/paper.py:kda_ref --remat=none,dots,block \
    --peers=kda,attention --tag=h200_train_kda

One process per entry (each peak memory is its own); writes <out_dir>/<date>_<tag>.{json,md,png} (default
runs/bench/) after
every entry and prints a line per entry. Ratios are against --baseline (default: the first peer).
"""

from absl import flags

from experiments import cli

flags.DEFINE_list("configs", ["experiments/configs/paper.py:kda_ref"], "Config files, path.py:variant.")
flags.DEFINE_list("remat", [], "Remat policies to time for every config (default: each config's own).")
flags.DEFINE_list("peers", ["kda"], "fla models to time at the first config's shape: kda, gdn, attention.")
flags.DEFINE_list("overrides", [], "model.field=value or train.field=value, applied to every config.")
flags.DEFINE_integer("batch", None, "B (default: the config's data.batch_size).")
flags.DEFINE_integer("seq_len", None, "T (default: the config's data.seq_len).")
flags.DEFINE_integer("steps", 10, "Timed steps per timer.")
flags.DEFINE_integer("warmup", 2, "Steps after the first (compiling) one before timing.")
flags.DEFINE_integer("log_every", 10, "How often the training loop fetches metrics, as in train.log_every.")
flags.DEFINE_integer("timeout", 600, "Seconds each entry's process may take.")
flags.DEFINE_string("baseline", None, "Entry the ratios are taken against (default: 'fla <first peer>').")
flags.DEFINE_string("out_dir", "runs/bench", "Where the JSON, markdown and PNG go (untracked: copy a report that "
                    "matters into benchmarks/ with its record).")
flags.DEFINE_string("tag", "train", "File name tag: <out_dir>/<date>_<tag>.*")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  cli.setup()
  from sdm_jax.benchmarking import train_bench
  specs = train_bench.build_specs(FLAGS.configs, remats=FLAGS.remat, peers=FLAGS.peers, batch=FLAGS.batch,
                                  seq_len=FLAGS.seq_len, steps=FLAGS.steps, warmup=FLAGS.warmup,
                                  log_every=FLAGS.log_every, overrides=FLAGS.overrides)
  baseline = FLAGS.baseline or (f"fla {FLAGS.peers[0]}" if FLAGS.peers else None)
  results = train_bench.run(specs, FLAGS.out_dir, FLAGS.tag, baseline=baseline, timeout_s=FLAGS.timeout,
                            log=lambda line: print(line, flush=True))
  print(train_bench.table(results, baseline))


if __name__ == "__main__":
  cli.run(main)
