r"""Compiled memory of Sparse Delta Memory's forward+backward, chunked op vs autodiff of the scan.

  python -m experiments.sdm_memory --seq_len=4096 --num_slots=65536 --value_dim=256 --topk=64

Compiles only (XLA's memory analysis); nothing runs, so it works on a CPU for GPU-sized shapes.
"""

from absl import flags

from experiments import cli
from sdm_jax.benchmarking.sdm_memory import compiled_memory

flags.DEFINE_integer("batch", 1, "B.")
flags.DEFINE_integer("seq_len", 4096, "T.")
flags.DEFINE_integer("heads", 2, "H.")
flags.DEFINE_integer("num_slots", 65536, "N, slots per head.")
flags.DEFINE_integer("value_dim", 256, "V.")
flags.DEFINE_integer("topk", 64, "W = R, slots written and read per token.")
flags.DEFINE_integer("chunk_size", 16, "Chunk size of the chunked op.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  shape = dict(B=FLAGS.batch, T=FLAGS.seq_len, H=FLAGS.heads, N=FLAGS.num_slots, V=FLAGS.value_dim, W=FLAGS.topk,
               R=FLAGS.topk, chunk_size=FLAGS.chunk_size)
  print(f"forward+backward of sparse_delta_rule, {shape}")
  print(f"{'impl':<28} {'temp GiB':>10} {'total GiB':>10}")
  for impl, label in (("chunk", "chunk (memory-lean vjp)"), ("scan", "scan (plain autodiff)")):
    print(f"compiling {impl}...", flush=True)
    stats = compiled_memory(impl, **shape)
    print(f"{label:<28} {stats['temp_bytes'] / 2**30:>10.2f} {stats['total_bytes'] / 2**30:>10.2f}", flush=True)


if __name__ == "__main__":
  cli.run(main)
