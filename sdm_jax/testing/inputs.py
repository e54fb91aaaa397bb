"""Random inputs of every mixer of the registry `sdm_jax.ops.MIXERS` and of the SDM op, and packed rows of documents.

Two distributions, each with its own use, drawn with numpy (no compile per shape; a peer in another framework gets the
same numbers):
- `make_inputs`, the tests' sweep (DESIGN.md section 6): float64 draws with a chosen decay scale and gate mode, so a
  check reaches decays from -0.01 to -30 and gates exactly 0 and 1.
- `make_op_inputs`, what the benchmarks and tools time and compare: q, k, v ~ N(0, 1) (the op L2-normalises q and k),
  log decay g = log_sigmoid(N(1, 1)) (mostly in [-1, 0], fp32), gates sigmoid(N(0, 1)), drawn in fp32.
Inputs are dicts in call order -- q, k, v, g, the mixer's gates, then "initial_state" -- so one helper calls any mixer
and differentiates with respect to every array in it.
"""

import functools
import zlib

import jax.numpy as jnp
import numpy as np

from sdm_jax import ops
from sdm_jax.ops.registry import gate_shapes

GATE_MODES = ("random", "zero", "one", "binary", "interior")


def seed_of(*parts):
  """A stable seed from a test's parametrisation, so each check draws its own inputs."""
  return zlib.crc32(repr(parts).encode())


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
  raise ValueError(f"gate_mode: expected one of {GATE_MODES}, got {gate_mode!r}")


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


def cotangents(o_shape, state_shape, seed, dtype=jnp.float32):
  """Random weights r_o, r_s of the tests' loss (`runs.loss`)."""
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal(o_shape), dtype),
          jnp.asarray(rng.standard_normal(state_shape), dtype))


def _apply(op, args, *, impl, chunk_size, **options):
  return op(**args, impl=impl, chunk_size=chunk_size, use_qk_l2norm=True, output_final_state=True, **options)


def make_op_inputs(mixer, B, T, H, K, V, dtype, seed, *, initial_state=True):
  """Builds the inputs of one mixer, as the benchmarks and tools draw them.

  Returns (fn, args): args = {q, k, v, g, <gates>, [initial_state]} (g and initial_state in at
  least fp32, the rest in `dtype`); fn(args, impl=..., chunk_size=..., **other options of the op) -> (o [B, T, H, V],
  final state [B, H, K, V] fp32), with use_qk_l2norm=True.
  """
  if mixer not in ops.MIXERS:
    raise ValueError(f"mixer: expected one of {sorted(ops.MIXERS)}, got {mixer!r}")
  spec = ops.MIXERS[mixer]
  rng = np.random.default_rng(seed)
  dtype = jnp.dtype(dtype)
  acc = jnp.promote_types(jnp.float32, dtype)
  shapes = gate_shapes(B, T, H, K, V)
  normal = lambda kind: rng.standard_normal(shapes[kind], np.float32)
  args = {"q": normal("key").astype(dtype), "k": normal("key").astype(dtype), "v": normal("value").astype(dtype),
          "g": (-np.logaddexp(0.0, -1.0 - normal(spec.decay))).astype(acc)}  # log_sigmoid(N(1, 1))
  for name, kind in spec.gates:
    args[name] = (1.0 / (1.0 + np.exp(-normal(kind)))).astype(dtype)
  if initial_state:
    args["initial_state"] = rng.standard_normal((B, H, K, V), np.float32).astype(acc)
  return functools.partial(_apply, spec.op), {name: jnp.asarray(x) for name, x in args.items()}


def make_readouts(B, T, H, K, V, dtype, seed, *, state=True):
  """Random r_o [B, T, H, V] and r_s [B, H, K, V] (None when state=False), in at least fp32: the weights of
  `runs.make_loss`."""
  rng = np.random.default_rng([seed, 1])
  acc = jnp.promote_types(jnp.float32, dtype)
  r_o = jnp.asarray(rng.standard_normal((B, T, H, V), np.float32).astype(acc))
  return r_o, jnp.asarray(rng.standard_normal((B, H, K, V), np.float32).astype(acc)) if state else None


def sdm_inputs(B, T, H, N, V, W, R, seed):
  """Random inputs of `sparse_delta_rule` as the benchmarks and tools draw them: (floats, ints).

  floats: m0 [H, N, V] ~ 0.01 N(0, 1) fp32, k_w [B, T, H, W] and q_w [B, T, H, R] softmaxes of N(0, 1) scores,
  v [B, T, H, V] ~ N(0, 1) bf16, g [B, T, H] = log_sigmoid(N(1, 1)) and beta [B, T, H] = sigmoid(N(0, 1)) fp32;
  ints: k_idx [B, T, H, W] and q_idx [B, T, H, R] uniform in [0, N) int32.
  """
  rng = np.random.default_rng(seed)
  softmax = lambda s: np.exp(s - s.max(-1, keepdims=True)) / np.exp(s - s.max(-1, keepdims=True)).sum(-1, keepdims=True)
  floats = {
      "m0": jnp.asarray(0.01 * rng.standard_normal((H, N, V), np.float32)),
      "k_w": jnp.asarray(softmax(rng.standard_normal((B, T, H, W), np.float32))),
      "v": jnp.asarray(rng.standard_normal((B, T, H, V), np.float32), jnp.bfloat16),
      "g": jnp.asarray(-np.logaddexp(0.0, -rng.standard_normal((B, T, H)) - 1.0), jnp.float32),
      "beta": jnp.asarray(1 / (1 + np.exp(-rng.standard_normal((B, T, H)))), jnp.float32),
      "q_w": jnp.asarray(softmax(rng.standard_normal((B, T, H, R), np.float32))),
  }
  ints = {"k_idx": jnp.asarray(rng.integers(0, N, (B, T, H, W)), jnp.int32),
          "q_idx": jnp.asarray(rng.integers(0, N, (B, T, H, R)), jnp.int32)}
  return floats, ints


def document_ids(B, T, docs, seed=0):
  """[B, T] int32 numpy array: each row cut into `docs` documents (ids 1..docs) at random distinct positions."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((B, T), np.int32)
  for b in range(B):
    cuts = np.sort(rng.choice(np.arange(1, T), size=docs - 1, replace=False))
    ids[b] = 1 + np.searchsorted(cuts, np.arange(T), side="right")
  return ids


def segment_ids(layout, B, T):
  """[B, T] int32 segment ids of a fixed layout, 0 (padding) where no document lies.

  layout: per row, its documents as (start, end, id), or as (start, end) with ids 1, 2, ... in order.
  """
  ids = np.zeros((B, T), np.int32)
  for row, documents in enumerate(layout):
    for i, document in enumerate(documents):
      start, end, segment = document if len(document) == 3 else (*document, i + 1)
      ids[row, start:end] = segment
  return jnp.asarray(ids)
