"""The DESIGN.md section 1 reductions between mixers, on scan and on chunk, outputs and gradients.

GDN-2 with b = w = beta (a per-head scalar) is KDA; KDA with the same decay in every channel is
GDN; FG2-GDN+ with beta_k = beta_v is FG2-GDN. A gate shared by several arguments of the general
mixer gets the sum of their gradients (chain rule), which checks the gate gradients as well.
"""

import jax.numpy as jnp
import pytest

from sdm_jax.testing.errors import assert_close, results
from sdm_jax.testing.inputs import cotangents, make_inputs, seed_of
from sdm_jax.testing.runs import outputs_and_grads


B, T, H, K, V = 2, 45, 2, 16, 32
TOL = 1e-5
IMPLS = ("scan", "chunk")


def _run(mixer, inputs, r_o, r_s, impl):
  return outputs_and_grads(mixer, inputs, r_o, r_s, impl=impl, chunk_size=16, use_qk_l2norm=True)


def _check(general, general_inputs, special, special_inputs, sum_grads, impl, seed):
  """Runs both mixers; `sum_grads` maps the general mixer's gradients onto the special one's arguments."""
  Vm = special_inputs["v"].shape[-1]
  r_o, r_s = cotangents((B, T, H, Vm), (B, H, K, Vm), seed)
  o, final_state, grads = _run(general, general_inputs, r_o, r_s, impl)
  expected = results(*_run(special, special_inputs, r_o, r_s, impl))
  assert_close(results(o, final_state, sum_grads(grads)), expected, TOL, f"{general} reduced vs {special}, impl={impl}")


@pytest.mark.parametrize("impl", IMPLS)
def test_gdn2_with_scalar_gates_is_kda(impl):
  seed = seed_of("gdn2->kda", impl)
  kda_inputs = make_inputs("kda", B, T, H, K, V, "mixed", "random", seed)
  beta = kda_inputs["beta"][..., None]
  gdn2_inputs = {**{n: x for n, x in kda_inputs.items() if n != "beta"},
                 "b": jnp.broadcast_to(beta, (B, T, H, K)), "w": jnp.broadcast_to(beta, (B, T, H, V))}

  def sum_grads(grads):
    grads = dict(grads)
    grads["beta"] = grads.pop("b").sum(-1) + grads.pop("w").sum(-1)
    return grads

  _check("gdn2", gdn2_inputs, "kda", kda_inputs, sum_grads, impl, seed + 1)


@pytest.mark.parametrize("impl", IMPLS)
def test_kda_with_channel_equal_decay_is_gdn(impl):
  seed = seed_of("kda->gdn", impl)
  gdn_inputs = make_inputs("gdn", B, T, H, K, V, "mixed", "random", seed)
  kda_inputs = {**gdn_inputs, "g": jnp.broadcast_to(gdn_inputs["g"][..., None], (B, T, H, K))}

  def sum_grads(grads):
    return {**grads, "g": grads["g"].sum(-1)}

  _check("kda", kda_inputs, "gdn", gdn_inputs, sum_grads, impl, seed + 1)


@pytest.mark.parametrize("impl", IMPLS)
def test_fg2_plus_with_equal_gates_is_fg2(impl):
  seed = seed_of("fg2_plus->fg2", impl)
  fg2_inputs = make_inputs("fg2_gdn", B, T, H, K, K, "mixed", "random", seed)
  plus_inputs = {**{n: x for n, x in fg2_inputs.items() if n != "beta"},
                 "beta_k": fg2_inputs["beta"], "beta_v": fg2_inputs["beta"]}

  def sum_grads(grads):
    grads = dict(grads)
    grads["beta"] = grads.pop("beta_k") + grads.pop("beta_v")
    return grads

  _check("fg2_gdn_plus", plus_inputs, "fg2_gdn", fg2_inputs, sum_grads, impl, seed + 1)
