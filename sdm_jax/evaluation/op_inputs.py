"""Random inputs for the dense mixers of `sdm_jax.ops`, and the readout loss the tools differentiate.

Shared by experiments/compare_impls.py, experiments/bench_ops.py and kernel tests, so every tool
times and checks the same distribution: q, k, v ~ N(0, 1) (the op L2-normalises q and k), log
decay g = log_sigmoid(N(1, 1)) (mostly in [-1, 0], fp32), gates sigmoid(N(0, 1)).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from sdm_jax import ops


@dataclasses.dataclass(frozen=True)
class Mixer:
  op: callable
  decay: str  # "head" (scalar per head, [B, T, H]) or "key" ([B, T, H, K])
  gates: tuple  # (name, "head" | "key" | "value") after g, in the op's argument order


MIXERS = {
    "gdn": Mixer(ops.gated_delta_rule, "head", (("beta", "head"),)),
    "kda": Mixer(ops.kda, "key", (("beta", "head"),)),
    "fg2_gdn": Mixer(ops.fg2_gdn, "key", (("beta", "key"),)),
    "fg2_gdn_plus": Mixer(ops.fg2_gdn_plus, "key", (("beta_k", "key"), ("beta_v", "value"))),
    "gdn2": Mixer(ops.gdn2, "key", (("b", "key"), ("w", "value"))),
}


def _apply(op, args, *, impl, chunk_size):
  return op(**args, impl=impl, chunk_size=chunk_size, use_qk_l2norm=True, output_final_state=True)


def make_op_inputs(mixer, B, T, H, K, V, dtype, seed, *, initial_state=True):
  """Builds the inputs of one mixer.

  Returns (fn, args): args = {q, k, v, g, <gates>, [initial_state]} (g and initial_state in at
  least fp32, the rest in `dtype`); fn(args, impl=..., chunk_size=...) -> (o [B, T, H, V],
  final state [B, H, K, V] fp32), with use_qk_l2norm=True.
  """
  if mixer not in MIXERS:
    raise ValueError(f"mixer: expected one of {sorted(MIXERS)}, got {mixer!r}")
  spec = MIXERS[mixer]
  dtype = jnp.dtype(dtype)
  acc = jnp.promote_types(jnp.float32, dtype)
  shapes = {"head": (B, T, H), "key": (B, T, H, K), "value": (B, T, H, V)}
  keys = iter(jax.random.split(jax.random.key(seed), 4 + len(spec.gates)))
  args = {
      "q": jax.random.normal(next(keys), shapes["key"], dtype),
      "k": jax.random.normal(next(keys), shapes["key"], dtype),
      "v": jax.random.normal(next(keys), shapes["value"], dtype),
      "g": jax.nn.log_sigmoid(1.0 + jax.random.normal(next(keys), shapes[spec.decay], acc)),
  }
  for name, kind in spec.gates:
    args[name] = jax.nn.sigmoid(jax.random.normal(next(keys), shapes[kind], acc)).astype(dtype)
  if initial_state:
    args["initial_state"] = jax.random.normal(jax.random.key(seed + 1), (B, H, K, V), acc)
  return functools.partial(_apply, spec.op), args


def make_readouts(B, T, H, K, V, dtype, seed, *, state=True):
  """Random r_o [B, T, H, V] and r_s [B, H, K, V] (None when state=False), in at least fp32."""
  acc = jnp.promote_types(jnp.float32, dtype)
  key_o, key_s = jax.random.split(jax.random.key(seed + 2))
  r_s = jax.random.normal(key_s, (B, H, K, V), acc) if state else None
  return jax.random.normal(key_o, (B, T, H, V), acc), r_s


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
