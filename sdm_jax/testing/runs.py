"""Running a mixer of the registry on an inputs dict (`inputs.make_inputs`) and differentiating the loss of
DESIGN.md section 6, sum(o r_o) + sum(S_T r_s), with respect to every input."""

import functools

import jax
import jax.numpy as jnp

from sdm_jax import ops

MIXERS = tuple(ops.MIXERS)  # the registry's names, in its order


def value_dim(mixer, K, V):
  """V, or K for a mixer that needs K == V (FG2-GDN scales k and v by the same gate)."""
  return ops.MIXERS[mixer].value_dim(K, V)


def arg_names(mixer):
  return ops.MIXERS[mixer].arguments


def call(mixer, inputs, **options):
  """Calls the public op of `mixer` on an inputs dict; options are its keyword arguments."""
  args = [inputs[name] for name in arg_names(mixer)]
  return ops.MIXERS[mixer].op(*args, initial_state=inputs.get("initial_state"), **options)


def loss(o, final_state, r_o, r_s):
  """DESIGN.md section 6: sum(o * r_o) + sum(S_T * r_s), accumulated in the weights' dtype (the tests' loss)."""
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


def make_loss(fn, impl, chunk_size, **options):
  """The benchmarks' loss of `inputs.make_op_inputs`'s fn: loss(args, r_o, r_s) = sum(o * r_o) + sum(S_T * r_s),
  with (o, S_T) as auxiliary output; options: the op's others (lower_bound).

  r_s may be None (the term is left out); S_T enters in its own dtype (fp32). Differentiate with
  jax.value_and_grad(..., has_aux=True).
  """
  def loss(args, r_o, r_s):
    o, final_state = fn(args, impl=impl, chunk_size=chunk_size, **options)
    value = jnp.sum(o.astype(r_o.dtype) * r_o)
    if r_s is not None:
      value = value + jnp.sum(final_state * r_s)
    return value, (o, final_state)
  return loss
