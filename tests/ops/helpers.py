"""Shared pieces of the ops tests: random mixer inputs, the DESIGN.md section 6 loss and error measure.

Inputs are a dict in call order -- q, k, v, g, the mixer's gates, then "initial_state" (an array
or None) -- so one helper calls any mixer and differentiates with respect to every array in it.
"""

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from sdm_jax import ops
from sdm_jax.ops.registry import gate_shapes

MIXERS = tuple(ops.MIXERS)  # the registry's names, in its order
GATE_MODES = ("random", "zero", "one", "binary", "interior")
# DESIGN.md section 6: fp32 (outputs, gradients) tolerances against the scan, per impl.
FP32_TOL = {"chunk": (1e-5, 1e-5), "pallas": (1e-4, 1e-3)}


def seed_of(*parts):
  """A stable seed from a test's parametrisation, so each check draws its own inputs."""
  return zlib.crc32(repr(parts).encode())


def value_dim(mixer, K, V):
  """V, or K for a mixer that needs K == V (FG2-GDN scales k and v by the same gate)."""
  return ops.MIXERS[mixer].value_dim(K, V)


def arg_names(mixer):
  return ops.MIXERS[mixer].arguments


def _log_decay(rng, shape, decay_scale):
  if decay_scale == "mixed":  # every regime at once: log-uniform per-step decay in [1e-3, 30]
    return -np.exp(rng.uniform(np.log(1e-3), np.log(30.0), shape))
  return -decay_scale * rng.uniform(0.5, 1.5, shape)


def _gate(rng, shape, gate_mode):
  if gate_mode == "random":
    return rng.uniform(0.0, 1.0, shape)
  if gate_mode == "zero":
    return np.zeros(shape)
  if gate_mode == "one":
    return np.ones(shape)
  if gate_mode == "binary":  # every entry exactly 0 or exactly 1
    return (rng.uniform(size=shape) < 0.5).astype(np.float64)
  if gate_mode == "interior":  # away from 0, where d sqrt(beta) / d beta is unbounded
    return rng.uniform(0.1, 0.9, shape)
  raise ValueError(f"unknown gate_mode {gate_mode!r}")


def make_inputs(mixer, B, T, H, K, V, decay_scale, gate_mode, seed, dtype=jnp.float32, *,
                initial_state=True, normalize_k=False):
  """Random inputs of `mixer` in call order, cast to `dtype` (the initial state to at least fp32).

  decay_scale: a number s (g = -s * U(0.5, 1.5) per step) or "mixed" (log-uniform in [1e-3, 30]).
  gate_mode: one of GATE_MODES. normalize_k: L2-normalise k here, for calls without
  use_qk_l2norm (unit keys keep the recurrence contractive).
  """
  shapes = gate_shapes(B, T, H, K, V)
  spec = ops.MIXERS[mixer]
  rng = np.random.default_rng(seed)
  k = rng.standard_normal(shapes["key"])
  if normalize_k:
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
  inputs = {
      "q": rng.standard_normal(shapes["key"]),
      "k": k,
      "v": rng.standard_normal(shapes["value"]),
      "g": _log_decay(rng, shapes[spec.decay], decay_scale),
  }
  for name, kind in spec.gates:
    inputs[name] = _gate(rng, shapes[kind], gate_mode)
  inputs["initial_state"] = rng.standard_normal((B, H, K, V)) if initial_state else None
  return cast(inputs, dtype)


def cast(inputs, dtype, state_dtype=None):
  """Casts every array to `dtype`; the initial state to `state_dtype` (default: at least fp32)."""
  if state_dtype is None:
    state_dtype = jnp.promote_types(dtype, jnp.float32)
  return {name: None if x is None else jnp.asarray(x, state_dtype if name == "initial_state" else dtype)
          for name, x in inputs.items()}


def call(mixer, inputs, **options):
  """Calls the public op of `mixer` on an inputs dict; options are its keyword arguments."""
  args = [inputs[name] for name in arg_names(mixer)]
  return ops.MIXERS[mixer].op(*args, initial_state=inputs.get("initial_state"), **options)


def cotangents(o_shape, state_shape, seed, dtype=jnp.float32):
  """Random weights r_o, r_s of the test loss."""
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal(o_shape), dtype),
          jnp.asarray(rng.standard_normal(state_shape), dtype))


def loss(o, final_state, r_o, r_s):
  """DESIGN.md section 6: sum(o * r_o) + sum(S_T * r_s), accumulated in the weights' dtype."""
  return jnp.sum(o.astype(r_o.dtype) * r_o) + jnp.sum(final_state.astype(r_s.dtype) * r_s)


@functools.lru_cache(maxsize=None)
def _grad_fn(mixer, jit, options):
  def objective(arrays, r_o, r_s):
    o, final_state = call(mixer, arrays, output_final_state=True, **dict(options))
    return loss(o, final_state, r_o, r_s), (o, final_state)

  grad_fn = jax.grad(objective, has_aux=True)
  return jax.jit(grad_fn) if jit else grad_fn


def outputs_and_grads(mixer, inputs, r_o, r_s, *, jit=True, **options):
  """(o, final state, {name: d loss / d name}) for every array in `inputs`.

  The jitted function is built once per (mixer, options), so inputs of the same shapes share one
  compilation -- the chunked backward takes seconds to compile on CPU.
  """
  arrays = {name: x for name, x in inputs.items() if x is not None}
  grads, (o, final_state) = _grad_fn(mixer, jit, tuple(sorted(options.items())))(arrays, r_o, r_s)
  return o, final_state, grads


def rel_err(x, ref):
  """||x - ref|| / ||ref|| in float64. A reference of exactly zero only accepts exactly zero."""
  x = np.asarray(x, np.float64)
  ref = np.asarray(ref, np.float64)
  if x.shape != ref.shape:
    raise AssertionError(f"shape {x.shape} != reference shape {ref.shape}")
  diff = np.linalg.norm(x - ref)
  scale = np.linalg.norm(ref)
  if scale == 0.0:
    return 0.0 if diff == 0.0 else np.inf
  return diff / scale


def error_report(actual, reference, tol):
  """(failed, one line per entry): every entry of `actual` finite and within `tol` of `reference`.

  actual, reference: dicts name -> array with the same keys. The reference is first rounded to the
  dtype of `actual` (at least fp32): a float64 value below fp32's range (exp(-200) after 200 steps of decay 1) is 0
  in fp32, and that 0 is the exact answer an fp32 implementation can give.
  """
  assert actual.keys() == reference.keys(), (sorted(actual), sorted(reference))
  lines, failed = [], False
  for name in reference:
    x = np.asarray(actual[name], np.float64)
    ref_dtype = np.promote_types(np.asarray(actual[name]).dtype, np.float32)
    ref = np.asarray(np.asarray(reference[name]).astype(ref_dtype), np.float64)
    finite = bool(np.all(np.isfinite(x)))
    err = rel_err(x, ref) if finite else np.nan
    # Below fp32's smallest normal number (1.2e-38) values are subnormal and carry no relative
    # precision; a difference that small is a pass whatever the reference's own size.
    floor = np.finfo(ref_dtype).tiny * np.sqrt(max(x.size, 1))
    bad = not finite or not (err <= tol or np.linalg.norm(x - ref) <= floor)
    failed |= bad
    lines.append(f"  {name:>16}: {'NON-FINITE' if not finite else f'{err:.3e}'}{'  <-- FAIL' if bad else ''}")
  return failed, "\n".join(lines)


def assert_close(actual, reference, tol, context=""):
  """Asserts `error_report` passes; on failure the message lists the error of every entry."""
  failed, report = error_report(actual, reference, tol)
  assert not failed, f"{context} (tolerance {tol:.0e}, ||x - ref|| / ||ref||):\n{report}"


def results(o, final_state, grads=None):
  """Flattens a run into the dict that `assert_close` compares."""
  out = {"o": o, "final_state": final_state}
  for name, grad in (grads or {}).items():
    out[f"d_{name}"] = grad
  return out
