r"""Times the Sparse Delta Memory op next to the dense GDN op at matching FLOPs, the table-row
traffic alone in XLA (sdm_bench.time_row_traffic: the rows an entry-by-entry forward moves), and
product-key addressing through the Pallas kernel and through XLA's top-k.

  python -m experiments.bench_sdm        # DESIGN.md section 3 / issue shapes on a GPU

Defaults: SDM H=2, N=65,536, V=1,024, W=R=128 over 4 x 4096 tokens (bf16 values, fp32 table);
GDN 16 heads of 128 x 128; addressing over 64K rows (32,768 tokens x 2 heads), sqrt(N)=256,
k=128, sub-key dim 128. On a CPU backend every size shrinks unless given. Writes
<out_dir>/<date>_<tag>.{json,md}; each measurement is written as soon as it is made.
"""

from absl import app, flags

from experiments import cli
from sdm_jax.benchmarking import sdm_bench
from sdm_jax.benchmarking.timing import error_text, run_metadata

flags.DEFINE_string("shape", "4x4096", "B x T of the SDM and GDN runs.")
flags.DEFINE_integer("sdm_heads", 2, "H of the SDM.")
flags.DEFINE_integer("num_slots", 65536, "N, slots per SDM head.")
flags.DEFINE_integer("value_dim", 1024, "V of the SDM.")
flags.DEFINE_integer("topk", 128, "W = R.")
flags.DEFINE_integer("gdn_heads", 16, "H of the dense GDN run.")
flags.DEFINE_integer("gdn_head_dim", 128, "K = V of the dense GDN run.")
flags.DEFINE_integer("address_rows", 32768, "Tokens of the addressing run (times sdm_heads rows).")
flags.DEFINE_integer("address_dim", 128, "Sub-key dimension of the addressing run.")
flags.DEFINE_list("impls", ["chunk", "pallas"], "Impls of the SDM op and of the dense GDN op to time.")
flags.DEFINE_list("sdm_chunk_sizes", ["16"], "Chunk sizes of the SDM chunk impl, each timed (pallas has none).")
flags.DEFINE_integer("gdn_chunk_size", 32, "Chunk size of the dense GDN op (32, as the gdn2 and kda benches run their pallas op).")
flags.DEFINE_integer("reps", 10, "Warm runs per timing (median).")
flags.DEFINE_string("out_dir", "runs/bench", "Where the JSON and markdown go (untracked: copy a report that "
                    "matters into benchmarks/ with its record).")
flags.DEFINE_string("tag", "sdm", "File name tag.")
FLAGS = flags.FLAGS

CPU_DEFAULTS = {"shape": "1x64", "num_slots": 1024, "value_dim": 32, "topk": 8, "gdn_heads": 2, "gdn_head_dim": 32,
                "address_rows": 256, "address_dim": 32}


def main(argv):
  del argv
  cli.setup(CPU_DEFAULTS)
  B, T = (int(x) for x in FLAGS.shape.split("x"))
  n = int(round(FLAGS.num_slots**0.5))
  if n * n != FLAGS.num_slots:
    raise app.UsageError(f"--num_slots: expected a perfect square, got {FLAGS.num_slots}")
  config = {name: FLAGS[name].value for name in ("shape", "sdm_heads", "num_slots", "value_dim", "topk", "gdn_heads",
                                                  "gdn_head_dim", "address_rows", "address_dim", "impls",
                                                  "sdm_chunk_sizes", "gdn_chunk_size", "reps")}
  meta = {**run_metadata(), "config": config}
  rows = []

  def record(name, fn, **kw):
    print(f"{name}: compiling and timing...", flush=True)
    try:
      result = fn(**kw)
    except Exception as error:  # record it and go on with the rest
      result = {"error": error_text(error)}
    rows.append({"what": name, **result})
    paths = sdm_bench.write_report(rows, meta, FLAGS.out_dir, FLAGS.tag)
    print(sdm_bench.format_table(rows[-1:]).splitlines()[-1], flush=True)
    return paths

  H, N, V, W = FLAGS.sdm_heads, FLAGS.num_slots, FLAGS.value_dim, FLAGS.topk
  K = FLAGS.gdn_head_dim
  for impl in FLAGS.impls:
    # impl="pallas" walks the tokens without chunks: one run, whatever --sdm_chunk_sizes says.
    for C in (int(c) for c in FLAGS.sdm_chunk_sizes[:1 if impl == "pallas" else None]):
      chunk = "" if impl == "pallas" else f" C={C}"
      record(f"sdm {impl}{chunk} {B}x{T} H={H} N={N} V={V} W=R={W}", sdm_bench.time_sdm, B=B, T=T, H=H, N=N, V=V,
             W=W, R=W, impl=impl, chunk_size=C, reps=FLAGS.reps)
    record(f"gdn {impl} C={FLAGS.gdn_chunk_size} {B}x{T} H={FLAGS.gdn_heads} K=V={K}", sdm_bench.time_dense,
           mixer="gdn", B=B, T=T, H=FLAGS.gdn_heads, K=K, V=K, impl=impl, chunk_size=FLAGS.gdn_chunk_size,
           reps=FLAGS.reps)
  record(f"sdm row traffic only, XLA {B}x{T} H={H} N={N} V={V} W=R={W}", sdm_bench.time_row_traffic, B=B, T=T, H=H,
         N=N, V=V, W=W, R=W, reps=FLAGS.reps)
  for impl in ("xla", "pallas"):
    paths = record(f"product_key_address {impl} rows={FLAGS.address_rows}x{H} n={n} k={W} D={FLAGS.address_dim}",
                   sdm_bench.time_addressing, rows=FLAGS.address_rows, heads=H, n=n, k=W, dim=FLAGS.address_dim,
                   impl=impl, reps=FLAGS.reps)
  print(f"\nwrote {paths['json']}, {paths['md']}")


if __name__ == "__main__":
  cli.run(main)
