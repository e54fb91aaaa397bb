"""Random inputs for every dense mixer of the registry `sdm_jax.ops.MIXERS` and for the SDM op, and the readout loss
the tools differentiate.

Shared by experiments/compare_impls.py, the benchmark modes (ops, packed, kernels) and kernel tests, so every tool
times and checks the same distribution: q, k, v ~ N(0, 1) (the op L2-normalises q and k), log
decay g = log_sigmoid(N(1, 1)) (mostly in [-1, 0], fp32), gates sigmoid(N(0, 1)).
"""

import functools

import jax.numpy as jnp
import numpy as np

from sdm_jax import ops
from sdm_jax.ops.registry import gate_shapes


def _apply(op, args, *, impl, chunk_size):
  return op(**args, impl=impl, chunk_size=chunk_size, use_qk_l2norm=True, output_final_state=True)


def make_op_inputs(mixer, B, T, H, K, V, dtype, seed, *, initial_state=True):
  """Builds the inputs of one mixer.

  Returns (fn, args): args = {q, k, v, g, <gates>, [initial_state]} (g and initial_state in at
  least fp32, the rest in `dtype`); fn(args, impl=..., chunk_size=...) -> (o [B, T, H, V],
  final state [B, H, K, V] fp32), with use_qk_l2norm=True.
  """
  if mixer not in ops.MIXERS:
    raise ValueError(f"mixer: expected one of {sorted(ops.MIXERS)}, got {mixer!r}")
  spec = ops.MIXERS[mixer]
  # Drawn with numpy: no compile per shape, and a peer in another framework gets the same numbers.
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
  """Random r_o [B, T, H, V] and r_s [B, H, K, V] (None when state=False), in at least fp32."""
  rng = np.random.default_rng([seed, 1])
  acc = jnp.promote_types(jnp.float32, dtype)
  r_o = jnp.asarray(rng.standard_normal((B, T, H, V), np.float32).astype(acc))
  return r_o, jnp.asarray(rng.standard_normal((B, H, K, V), np.float32).astype(acc)) if state else None


def make_loss(fn, impl, chunk_size):
  """loss(args, r_o, r_s) = sum(o * r_o) + sum(S_T * r_s), with (o, S_T) as auxiliary output.

  r_s may be None (the term is left out). Differentiate with jax.value_and_grad(..., has_aux=True).
  """
  def loss(args, r_o, r_s):
    o, final_state = fn(args, impl=impl, chunk_size=chunk_size)
    value = jnp.sum(o.astype(r_o.dtype) * r_o)
    if r_s is not None:
      value = value + jnp.sum(final_state * r_s)
    return value, (o, final_state)
  return loss


def sdm_inputs(B, T, H, N, V, W, R, seed):
  """Random SDM inputs: bf16 values, fp32 table, weights a softmax over random scores."""
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
