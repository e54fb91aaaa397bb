"""bf16 inputs, and the JAX transformations users apply to the ops: jit, vmap, grad under jit."""

import jax
import jax.numpy as jnp
import pytest

from sdm_jax.testing.errors import TOLERANCES, assert_close, results
from sdm_jax.testing.inputs import cast, cotangents, make_inputs, seed_of
from sdm_jax.testing.lowering import equations
from sdm_jax.testing.runs import MIXERS, call, loss, outputs_and_grads, value_dim


B, H, K, V = 2, 2, 16, 32


def _inputs(mixer, T, seed):
  return make_inputs(mixer, B, T, H, K, value_dim(mixer, K, V), "mixed", "random", seed)


def _weights(mixer, T, seed):
  Vm = value_dim(mixer, K, V)
  return cotangents((B, T, H, Vm), (B, H, K, Vm), seed)


def _forward(mixer, impl="chunk"):
  def forward(inputs):
    return call(mixer, inputs, impl=impl, chunk_size=16, use_qk_l2norm=True, output_final_state=True)
  return forward


@pytest.mark.parametrize("impl", ["chunk", "pallas"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_bf16_matches_fp32_scan(mixer, impl):
  """DESIGN.md section 6: bf16 inputs within 1e-2 of the fp32 scan on the same (bf16-rounded) values."""
  T, seed = 65, seed_of("bf16", mixer)
  bf16_inputs = cast(_inputs(mixer, T, seed), jnp.bfloat16)  # the initial state stays fp32
  assert bf16_inputs["initial_state"].dtype == jnp.float32
  r_o, r_s = _weights(mixer, T, seed + 1)
  o, final_state, grads = outputs_and_grads(mixer, bf16_inputs, r_o, r_s, impl=impl, chunk_size=32,
                                            use_qk_l2norm=True)
  assert o.dtype == jnp.bfloat16
  assert final_state.dtype == jnp.float32
  assert {n: x.dtype for n, x in grads.items()} == {n: bf16_inputs[n].dtype for n in grads}
  reference = outputs_and_grads(mixer, cast(bf16_inputs, jnp.float32), r_o, r_s, impl="scan", use_qk_l2norm=True)
  assert_close(results(o, final_state, grads), results(*reference), TOLERANCES["bfloat16"][impl],
               f"bf16 {impl} vs fp32 scan, {mixer}")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("mixer", ["kda", "gdn"])  # a decay per channel, one per head
def test_pallas_backward_moves_the_chunk_states_in_bf16_under_bf16_inputs(mixer, dtype):
  """impl="pallas"'s backward: the replayed state pass writes the state entering every chunk and R, state_pass_bwd
  every chunk's dS and dR, and intra_chunk_bwd reads them, all in bf16 for bf16 inputs and fp32 for fp32 ones
  (DESIGN.md section 2), as the launches of the traced gradient receive and return them."""
  T, C = 64, 16
  inputs = cast(_inputs(mixer, T, seed_of("states", mixer)), dtype)
  r_o, r_s = _weights(mixer, T, 0)

  def objective(arrays):
    o, final_state = call(mixer, arrays, impl="pallas", chunk_size=C, use_qk_l2norm=True, output_final_state=True)
    return loss(o, final_state, r_o, r_s)

  launches = {}
  for eqn in equations(jax.make_jaxpr(jax.grad(objective))(inputs)):
    if eqn.primitive.name == "pallas_call":
      received, returned = [v.aval for v in eqn.invars], list(eqn.params["out_avals"])
      launches.setdefault(eqn.params["name"], []).append((received, returned))
  states_shape = (B, H, T // C, K, value_dim(mixer, K, V))
  chunk_states = lambda avals: [x.dtype for x in avals if x.shape == states_shape]
  saving = [returned for _, returned in launches["delta_rule_state_pass"] if chunk_states(returned)]
  assert len(saving) == 1 and chunk_states(saving[0]) == [dtype]
  (_, returned_bwd), = launches["delta_rule_state_pass_bwd"]
  (received, _), = launches["delta_rule_intra_chunk_bwd"]
  assert chunk_states(returned_bwd) == [dtype] and chunk_states(received) == [dtype, dtype]
  # R (the saving state pass's last result) and dR (state_pass_bwd's first), read only by bf16-operand dots.
  assert saving[0][-1].dtype == dtype and returned_bwd[0].dtype == dtype


@pytest.mark.parametrize("mixer", MIXERS)
def test_jit_matches_eager(mixer):
  inputs = _inputs(mixer, 20, seed_of("jit", mixer))
  forward = _forward(mixer)
  assert_close(results(*jax.jit(forward)(inputs)), results(*forward(inputs)), 1e-6, f"jit vs eager, {mixer}")


@pytest.mark.parametrize("impl", ["scan", "chunk"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_vmap_over_leading_axis_matches_loop(mixer, impl):
  batches = [_inputs(mixer, 20, seed_of("vmap", mixer, impl, i)) for i in range(3)]
  stacked = {name: jnp.stack([b[name] for b in batches]) for name in batches[0]}
  forward = jax.jit(_forward(mixer, impl))
  looped = [forward(b) for b in batches]
  o, final_state = jax.jit(jax.vmap(forward))(stacked)
  assert o.shape == (3,) + looped[0][0].shape and final_state.shape == (3,) + looped[0][1].shape
  expected = results(jnp.stack([o for o, _ in looped]), jnp.stack([s for _, s in looped]))
  assert_close(results(o, final_state), expected, 1e-6, f"vmap vs loop, {mixer} impl={impl}")


@pytest.mark.parametrize("mixer", ["fg2_gdn", "gdn2"])  # the square-root gates and the two channel gates
def test_grad_under_jit_matches_eager_grad(mixer):
  T, seed = 20, seed_of("grad-jit", mixer)
  inputs = _inputs(mixer, T, seed)
  r_o, r_s = _weights(mixer, T, seed + 1)
  options = dict(impl="chunk", chunk_size=16, use_qk_l2norm=True)
  jitted = results(*outputs_and_grads(mixer, inputs, r_o, r_s, jit=True, **options))
  eager = results(*outputs_and_grads(mixer, inputs, r_o, r_s, jit=False, **options))
  assert_close(jitted, eager, 1e-5, f"jit(grad) vs grad, {mixer}")
