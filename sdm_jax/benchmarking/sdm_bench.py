"""Timing Sparse Delta Memory: the op (forward, forward+backward) next to the dense GDN op at
matching FLOPs, the table-row traffic of an entry-by-entry SDM forward, and product-key
addressing through the Pallas kernel and through XLA: the registry's `sdm` mode. With breakdown, the op's kernels
by device time (CUPTI) too: sparse_tokens_fwd and sparse_tokens_bwd against the XLA work around them."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.benchmarking.op_bench import KERNEL_PARTS, parse_shapes, time_impl
from sdm_jax.benchmarking.tables import NO_KERNELS, Column, kernel_section, table, write_tables
from sdm_jax.benchmarking.timing import (back_to_back_ms, compile_timed, error_text, kernel_summary, median_ms,
                                         run_metadata)
from sdm_jax.ops import product_key_address, sparse_delta_rule
from sdm_jax.ops.sparse_pallas import PallasConfig
from sdm_jax.testing.inputs import make_op_inputs, make_readouts, sdm_inputs

INPUT_SETS = 3


def sdm_options(text, setting):
  """'rows_dtype:rows_segments[:table_dtype[:table_grad_dtype]]' -> sparse_delta_rule's keyword options for
  impl="pallas", checked by its config (`sparse_pallas.PallasConfig`); ValueError naming `setting` otherwise."""
  parts = text.split(":")
  try:
    if len(parts) not in (2, 3, 4):
      raise ValueError(f"{len(parts)} fields, not 2 to 4")
    options = {"rows_dtype": parts[0], "rows_segments": int(parts[1])}
    options.update(zip(("table_dtype", "table_grad_dtype"), parts[2:]))
    PallasConfig(**options)
  except ValueError as error:
    raise ValueError(f"{setting}: expected rows_dtype:rows_segments[:table_dtype[:table_grad_dtype]], got {text!r} "
                     f"({error})") from None
  return options


def sdm_shapes(B, T, H, N, V, W, R):
  """`sdm_inputs`' (floats, ints) as jax.ShapeDtypeStructs: the same shapes and dtypes, nothing drawn."""
  f32, bf16, i32 = jnp.float32, jnp.bfloat16, jnp.int32
  floats = {"m0": (H, N, V), "k_w": (B, T, H, W), "v": (B, T, H, V), "g": (B, T, H), "beta": (B, T, H),
            "q_w": (B, T, H, R)}
  floats = {name: jax.ShapeDtypeStruct(shape, bf16 if name == "v" else f32) for name, shape in floats.items()}
  ints = {"k_idx": jax.ShapeDtypeStruct((B, T, H, W), i32), "q_idx": jax.ShapeDtypeStruct((B, T, H, R), i32)}
  return floats, ints


def sdm_calls(impl, chunk_size=16, **options):
  """(forward, loss) of sparse_delta_rule(impl=impl, chunk_size=chunk_size, **options), the one pair every SDM
  measurement times: forward(floats, ints, segment_ids=None) -> o; loss(floats, ints, r_o, segment_ids=None) ->
  (sum(o * r_o), o), the final table unused as in training (r_o an argument: closed over, XLA would fold it into the
  program)."""
  def forward(floats, ints, segment_ids=None):
    return sparse_delta_rule(**floats, **ints, impl=impl, chunk_size=chunk_size, segment_ids=segment_ids,
                             **options)[0]

  def loss(floats, ints, r_o, segment_ids=None):
    o = forward(floats, ints, segment_ids)
    return jnp.sum(o.astype(jnp.float32) * r_o), o

  return forward, loss


def time_sdm(B, T, H, N, V, W, R, *, impl="chunk", chunk_size=16, reps=10, seed=0, breakdown=False):
  """{compile_fwd_s, compile_fwd_bwd_s, fwd_ms, fwd_bwd_ms, fwd_host_ms, fwd_bwd_host_ms (back to back), and with
  breakdown kernels_fwd, kernels_fwd_bwd (`timing.kernel_summary` of one more run)} of sparse_delta_rule(impl=impl)."""
  sets = [sdm_inputs(B, T, H, N, V, W, R, seed + i) for i in range(INPUT_SETS)]
  r_o = jnp.asarray(np.random.default_rng(seed).standard_normal((B, T, H, V), np.float32))

  forward, loss = sdm_calls(impl, chunk_size)
  fwd, compile_fwd_s = compile_timed(forward, *sets[0])
  step, compile_step_s = compile_timed(jax.value_and_grad(loss, has_aux=True), *sets[0], r_o)
  timings = {"compile_fwd_s": compile_fwd_s, "compile_fwd_bwd_s": compile_step_s,
             "fwd_ms": median_ms(fwd, sets, reps), "fwd_bwd_ms": median_ms(step, [(*s, r_o) for s in sets], reps),
             "fwd_host_ms": back_to_back_ms(fwd, sets, reps),
             "fwd_bwd_host_ms": back_to_back_ms(step, [(*s, r_o) for s in sets], reps)}
  if breakdown:
    timings["kernels_fwd"] = kernel_summary(lambda: jax.block_until_ready(fwd(*sets[0])))
    timings["kernels_fwd_bwd"] = kernel_summary(lambda: jax.block_until_ready(step(*sets[0], r_o)))
  return timings


def row_traffic(m0, k_idx, k_w, v, g, beta, q_idx, q_w):
  """Only the table-row traffic of the SDM forward, every token against the start table.

  Arguments as sparse_delta_rule's (m0: [H, N, V]). Each token gathers its W write rows and forms
  the delta prediction r = exp(g) sum_w k_w M[k_idx] and d = beta (v - r); the rows at k_idx are
  then set to k_w d, and o = sum_r q_w M[q_idx] is read after all the writes. The written row lacks
  the op's exp(g) M[i] term: keeping the gathered rows until the scatter would make XLA
  materialise them or gather them twice, which a kernel holding them on chip does not pay. Where
  a slot is written twice, which write lands is unspecified; the traffic is the same.
  Returns (o [B, T, H, V] fp32, table [B, H, N, V] fp32).
  """
  B, _, H, _ = v.shape
  table = jnp.broadcast_to(m0.astype(jnp.float32), (B, *m0.shape))
  b = jnp.arange(B)[:, None, None, None]
  h = jnp.arange(H)[None, None, :, None]
  # An elementwise product and a sum, not an einsum, so that XLA can fuse the gather into the
  # reduction instead of materialising the gathered rows for a dot.
  r = jnp.exp(g)[..., None] * jnp.sum(k_w[..., None] * table[b, h, k_idx], axis=-2)
  d = beta[..., None] * (v.astype(jnp.float32) - r)
  table = table.at[b, h, k_idx].set(k_w[..., None] * d[..., None, :])
  return jnp.sum(q_w[..., None] * table[b, h, q_idx], axis=-2), table


def time_row_traffic(B, T, H, N, V, W, R, *, reps=10, seed=0):
  """{compile_s, fwd_ms, row_bytes, row_gb_per_s} of row_traffic on sdm_inputs: what XLA takes for
  only the rows an entry-by-entry SDM forward reads (W + R per token) and writes (W per token), as
  the chunk and pallas impls do at chunk sizes <= 64. Such a forward needs at least row_bytes at the
  device's peak bandwidth. (A forward over longer chunks could read a row shared by several entries
  of its chunk once: for uniform slots, C W entries touch N (1 - exp(-C W / N)) distinct rows.)

  row_bytes = B T H (2 W + R) V 4 (fp32 rows gathered, then written); broadcasting m0 to the
  batch's table (B H N V x 4 bytes written) is timed but not counted, as in the op. Where XLA
  does not fuse the gathers into their weighted sums it materialises [B, T, H, W, V] and
  [B, T, H, R, V] fp32 (17 GB each at B=4, T=4096, H=2, W=R=128, V=1024; that fits an H200) and
  the extra traffic raises the time further. The CPU backend does materialise both (compiled temp
  memory = the two gathers); a GPU compile is unchecked.
  """
  sets = [sdm_inputs(B, T, H, N, V, W, R, seed + i) for i in range(INPUT_SETS)]
  fwd, compile_s = compile_timed(lambda floats, ints: row_traffic(**floats, **ints), *sets[0])
  fwd_ms = median_ms(fwd, sets, reps)
  row_bytes = B * T * H * (2 * W + R) * V * 4
  return {"compile_s": compile_s, "fwd_ms": fwd_ms, "row_bytes": row_bytes, "row_gb_per_s": row_bytes / fwd_ms / 1e6}


def time_dense(mixer, B, T, H, K, V, *, impl="chunk", chunk_size=64, reps=10, seed=0, breakdown=False):
  """The same timings for a dense mixer (bf16 inputs), through the `ops` mode's path (`op_bench.time_impl`)."""
  built = [make_op_inputs(mixer, B, T, H, K, V, "bfloat16", seed + 10 * i, initial_state=False)
           for i in range(INPUT_SETS)]
  readout, _ = make_readouts(B, T, H, K, V, "bfloat16", seed, state=False)
  timings, _ = time_impl(built[0][0], [args for _, args in built], readout, impl, chunk_size, reps, breakdown)
  return timings


def time_addressing(rows, heads, n, k, dim, *, impl, reps=10, seed=0):
  """{compile_s, fwd_ms} of product_key_address over `rows` tokens x `heads` heads."""
  rng = np.random.default_rng(seed)
  sets = [tuple(jnp.asarray(rng.standard_normal(shape, np.float32)) for shape in
                ((1, rows, heads, dim), (1, rows, heads, dim), (heads, n, dim), (heads, n, dim)))
          for _ in range(INPUT_SETS)]
  fwd, compile_s = compile_timed(lambda *xs: product_key_address(*xs, k, impl=impl), *sets[0])
  return {"compile_s": compile_s, "fwd_ms": median_ms(fwd, sets, reps)}


def _note(row):
  if "row_bytes" in row:
    return f"{row['row_bytes'] / 1e9:.3g} GB of rows at {row['row_gb_per_s']:.0f} GB/s"
  return row.get("error", "")


COLUMNS = (Column("what", "what"), Column("fwd ms", "fwd_ms", ".3f"), Column("fwd+bwd ms", "fwd_bwd_ms", ".3f"),
           Column("back to back fwd / fwd+bwd ms", lambda row: (row.get("fwd_host_ms"), row.get("fwd_bwd_host_ms")),
                  ".3f"), Column("note", _note))


def format_table(rows):
  """Markdown table of bench rows ({"what", fwd_ms?, fwd_bwd_ms?, error?, row_bytes?}); a missing time
  is '-'; a row traffic row notes its bytes and bandwidth."""
  return table(COLUMNS, rows)


def write_report(rows, meta, out_dir, tag):
  """Writes <out_dir>/<date>_<tag>.{json,md}; returns their paths."""
  kernels = kernel_section(rows, lambda row: row["what"], KERNEL_PARTS)
  notes = [NO_KERNELS] if meta.get("config", {}).get("breakdown") and not kernels else []
  paths = write_tables(rows, meta, out_dir, tag, "Sparse Delta Memory", notes, format_table(rows) + kernels)
  return {ext: paths[ext] for ext in ("json", "md")}


def check_settings(settings):
  """ValueError naming the setting unless `settings` (registry.SdmSettings) can run."""
  if math.isqrt(settings.num_slots) ** 2 != settings.num_slots:
    raise ValueError(f"num_slots: expected a perfect square (the addressing's sqrt(N) sub-keys), got "
                     f"{settings.num_slots}")
  if not parse_shapes(",".join(settings.shapes)):
    raise ValueError("shapes: expected at least one B x T")


def bench(settings, out_dir, tag, log=print):
  """The `sdm` mode over `settings` (registry.SdmSettings), each measurement written as soon as it is made;
  returns (rows, paths)."""
  s = settings
  meta = {**run_metadata(), "config": dataclasses.asdict(s)}
  rows, paths = [], None

  def record(name, fn, **kw):
    log(f"{name}: compiling and timing...")
    try:
      result = fn(**kw)
    except Exception as error:  # record it and go on with the rest
      result = {"error": error_text(error)}
    rows.append({"what": name, **result})
    log(format_table(rows[-1:]).splitlines()[-1])
    return write_report(rows, meta, out_dir, tag)

  H, N, V, W, K = s.sdm_heads, s.num_slots, s.value_dim, s.topk, s.gdn_head_dim
  for B, T in parse_shapes(",".join(s.shapes)):
    for impl in s.impls:
      # impl="pallas" walks the tokens without chunks: one run, whatever sdm_chunk_sizes says.
      for C in s.sdm_chunk_sizes[:1 if impl == "pallas" else None]:
        chunk = "" if impl == "pallas" else f" C={C}"
        paths = record(f"sdm {impl}{chunk} {B}x{T} H={H} N={N} V={V} W=R={W}", time_sdm, B=B, T=T, H=H, N=N, V=V,
                       W=W, R=W, impl=impl, chunk_size=C, reps=s.reps, breakdown=s.breakdown)
      paths = record(f"gdn {impl} C={s.gdn_chunk_size} {B}x{T} H={s.gdn_heads} K=V={K}", time_dense, mixer="gdn",
                     B=B, T=T, H=s.gdn_heads, K=K, V=K, impl=impl, chunk_size=s.gdn_chunk_size, reps=s.reps,
                     breakdown=s.breakdown)
    paths = record(f"sdm row traffic only, XLA {B}x{T} H={H} N={N} V={V} W=R={W}", time_row_traffic, B=B, T=T, H=H,
                   N=N, V=V, W=W, R=W, reps=s.reps)
  n = math.isqrt(N)
  for impl in ("xla", "pallas"):
    paths = record(f"product_key_address {impl} rows={s.address_rows}x{H} n={n} k={W} D={s.address_dim}",
                   time_addressing, rows=s.address_rows, heads=H, n=n, k=W, dim=s.address_dim, impl=impl, reps=s.reps)
  log(f"\nwrote {paths['json']}, {paths['md']}")
  return rows, paths
