"""Holds the implementations of one mixer to each other: outputs, final state, every gradient, timings.

The first impl is the reference. Each impl is jitted twice: the forward alone, and
jax.value_and_grad of loss = sum(o * r_o) + sum(S_T * r_s) over all inputs at once, whose
auxiliary output gives o and S_T, so the compared numbers are those of a training step. The forward alone's o
and S_T are compared too ("o (forward alone)"): impl="pallas" takes another path without gradients.
"""

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax.benchmarking.tables import Column, table
from sdm_jax.benchmarking.timing import compile_timed, median_ms
from sdm_jax.testing.errors import relative_error
from sdm_jax.testing.inputs import make_op_inputs, make_readouts
from sdm_jax.testing.runs import make_loss


def run_impl(fn, args, readouts, impl, chunk_size, reps, log=print):
  """Returns (quantities {name: np.ndarray}, timings {compile_fwd_s, compile_fwd_bwd_s, fwd_ms, fwd_bwd_ms})."""
  def forward(args):
    return fn(args, impl=impl, chunk_size=chunk_size)

  log(f"compiling {impl} fwd...")
  fwd, compile_fwd_s = compile_timed(forward, args)
  log(f"compiling {impl} fwd+bwd...")
  step, compile_step_s = compile_timed(jax.value_and_grad(make_loss(fn, impl, chunk_size), has_aux=True),
                                       args, *readouts)
  (_, (o, final_state)), grads = step(args, *readouts)
  o_alone, final_state_alone = fwd(args)
  log(f"timing {impl} ({reps} warm runs each)...")
  timings = {
      "compile_fwd_s": compile_fwd_s,
      "compile_fwd_bwd_s": compile_step_s,
      "fwd_ms": median_ms(fwd, [(args,)], reps),
      "fwd_bwd_ms": median_ms(step, [(args, *readouts)], reps),
  }
  quantities = {"o": o, "final_state": final_state, "o (forward alone)": o_alone,
                "final_state (forward alone)": final_state_alone, **{f"d{name}": grads[name] for name in args}}
  return {name: np.asarray(x, np.float64) for name, x in quantities.items()}, timings


def error_row(name, x, ref):
  """{quantity, rel_err = ||x - ref|| / ||ref||, max_abs, finite} for one compared quantity."""
  finite = bool(np.isfinite(x).all() and np.isfinite(ref).all())
  return {"quantity": name, "rel_err": relative_error(x, ref), "max_abs": float(np.max(np.abs(x - ref), initial=0.0)),
          "finite": finite}


def compare_impls(mixer, impls, *, B, T, H, K, V, dtype, chunk_size=64, seed=0, initial_state=True,
                  reps=5, log=print):
  """Runs `impls` of `mixer` on one random input set and compares each with impls[0].

  Returns {"config", "timings": {impl: ...}, "comparisons": {"<ref> vs <impl>": [error_row, ...]},
  "all_finite"}.
  """
  if len(impls) < 2:
    raise ValueError(f"impls: expected at least two impls to compare, got {impls}")
  fn, args = make_op_inputs(mixer, B, T, H, K, V, dtype, seed, initial_state=initial_state)
  readouts = make_readouts(B, T, H, K, V, dtype, seed)
  results = {impl: run_impl(fn, args, readouts, impl, chunk_size, reps, log) for impl in impls}
  ref_name, (ref, _) = impls[0], results[impls[0]]
  comparisons = {f"{ref_name} vs {impl}": [error_row(name, results[impl][0][name], ref[name]) for name in ref]
                 for impl in impls[1:]}
  config = {"mixer": mixer, "impls": list(impls), "B": B, "T": T, "H": H, "K": K, "V": V,
            "dtype": str(jnp.dtype(dtype)), "chunk_size": chunk_size, "seed": seed, "initial_state": initial_state}
  return {
      "config": config,
      "timings": {impl: timings for impl, (_, timings) in results.items()},
      "comparisons": comparisons,
      "all_finite": all(row["finite"] for rows in comparisons.values() for row in rows),
  }


def format_report(report):
  """The comparison tables and the timing table, in markdown."""
  c = report["config"]
  lines = [f"{c['mixer']}  B={c['B']} T={c['T']} H={c['H']} K={c['K']} V={c['V']} {c['dtype']} "
           f"chunk_size={c['chunk_size']} initial_state={c['initial_state']}"]
  errors = [Column("quantity", "quantity"), Column("rel err", "rel_err", ".2e"), Column("max abs", "max_abs", ".2e"),
            Column("finite?", lambda r: "yes" if r["finite"] else "NO")]
  for pair, rows in report["comparisons"].items():
    lines += ["", pair, "", table(errors, rows)]
  timings = [Column("impl", "impl"), Column("compile fwd s", "compile_fwd_s", ".2f"),
             Column("compile fwd+bwd s", "compile_fwd_bwd_s", ".2f"), Column("fwd ms", "fwd_ms", ".3f"),
             Column("fwd+bwd ms", "fwd_bwd_ms", ".3f")]
  lines += ["", table(timings, [{"impl": impl, **t} for impl, t in report["timings"].items()])]
  return "\n".join(lines)
