"""impl="scan" (the ground truth of every other test) against float64 NumPy loops.

Each loop is written from its mixer's own state update in DESIGN.md section 1, not from the shared
(u, e, z) table the implementation uses, so a wrong entry in that table cannot hide here.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdm_jax.testing.errors import assert_close
from sdm_jax.testing.inputs import cotangents, make_inputs, seed_of
from sdm_jax.testing.runs import MIXERS, arg_names, call, loss, value_dim


B, H, K, V = 2, 2, 16, 32


def _gdn_step(S, k, v, g, beta):
  # S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, a_t scalar per head
  return np.exp(g) * (np.eye(k.size) - beta * np.outer(k, k)) @ S + beta * np.outer(k, v)


def _kda_step(S, k, v, g, beta):
  # S_t = (I - beta_t k_t k_t^T) Diag(a_t) S_{t-1} + beta_t k_t v_t^T
  return (np.eye(k.size) - beta * np.outer(k, k)) @ np.diag(np.exp(g)) @ S + beta * np.outer(k, v)


def _fg2_step(S, k, v, g, beta):
  # k~ = sqrt(beta) k, v~ = sqrt(beta) v; S_t = (I - k~ k~^T) Diag(a_t) S_{t-1} + k~ v~^T
  k_t, v_t = np.sqrt(beta) * k, np.sqrt(beta) * v
  return (np.eye(k.size) - np.outer(k_t, k_t)) @ np.diag(np.exp(g)) @ S + np.outer(k_t, v_t)


def _fg2_plus_step(S, k, v, g, beta_k, beta_v):
  # k~ = sqrt(beta^k) k, v~ = sqrt(beta^v) v; same update as FG2-GDN
  k_t, v_t = np.sqrt(beta_k) * k, np.sqrt(beta_v) * v
  return (np.eye(k.size) - np.outer(k_t, k_t)) @ np.diag(np.exp(g)) @ S + np.outer(k_t, v_t)


def _gdn2_step(S, k, v, g, b, w):
  # S_t = (I - k_t (b_t * k_t)^T) Diag(a_t) S_{t-1} + k_t (w_t * v_t)^T
  return (np.eye(k.size) - np.outer(k, b * k)) @ np.diag(np.exp(g)) @ S + np.outer(k, w * v)


STEPS = {"gdn": _gdn_step, "kda": _kda_step, "fg2_gdn": _fg2_step, "fg2_gdn_plus": _fg2_plus_step,
         "gdn2": _gdn2_step}


def test_every_registered_mixer_has_its_papers_step():
  """README "Contributing: adding a mixer": a new mixer needs its update rule written here."""
  assert set(MIXERS) <= set(STEPS), sorted(set(MIXERS) - set(STEPS))


def numpy_reference(mixer, inputs, scale=None, use_qk_l2norm=False):
  """(o [B, T, H, V], S_T [B, H, K, V]) by a float64 loop over batch, head and token."""
  q, k, v, g, *gates = (np.asarray(inputs[name], np.float64) for name in arg_names(mixer))
  Bn, T, Hn, Kn = q.shape
  if use_qk_l2norm:
    q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + 1e-6)
    k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + 1e-6)
  scale = Kn**-0.5 if scale is None else scale
  h0 = inputs["initial_state"]
  state = np.zeros((Bn, Hn, Kn, v.shape[-1])) if h0 is None else np.array(h0, np.float64)
  o = np.empty(v.shape)
  for b in range(Bn):
    for h in range(Hn):
      S = state[b, h]
      for t in range(T):
        S = STEPS[mixer](S, k[b, t, h], v[b, t, h], g[b, t, h], *(x[b, t, h] for x in gates))
        o[b, t, h] = scale * S.T @ q[b, t, h]
      state[b, h] = S
  return o, state


# (initial state, use_qk_l2norm, scale, gate mode): every state x l2norm pair, both scale paths.
REFERENCE_CASES = [
    (False, False, None, "random"),
    (True, False, 0.37, "random"),
    (False, True, None, "random"),
    (True, True, 0.37, "random"),
    (True, True, None, "binary"),
]


@pytest.mark.parametrize("h0, l2norm, scale, gate_mode", REFERENCE_CASES)
@pytest.mark.parametrize("mixer", MIXERS)
def test_scan_matches_numpy_loop(x64, mixer, h0, l2norm, scale, gate_mode):
  inputs = make_inputs(mixer, B, 37, H, K, value_dim(mixer, K, V), "mixed", gate_mode,
                       seed_of(mixer, h0, l2norm, scale, gate_mode), jnp.float64, initial_state=h0,
                       normalize_k=not l2norm)
  o, final_state = call(mixer, inputs, scale=scale, use_qk_l2norm=l2norm, output_final_state=True, impl="scan")
  assert o.dtype == jnp.float64 and final_state.dtype == jnp.float64
  o_ref, state_ref = numpy_reference(mixer, inputs, scale, l2norm)
  assert_close({"o": o, "final_state": final_state}, {"o": o_ref, "final_state": state_ref}, 1e-10,
               f"scan vs NumPy, {mixer}")


@pytest.mark.parametrize("impl", ["scan", "chunk"])
def test_no_final_state_unless_asked(impl):
  inputs = make_inputs("gdn2", 1, 5, 1, 16, 8, 0.1, "random", seed_of(impl))
  o, final_state = call("gdn2", inputs, impl=impl)
  assert final_state is None
  assert o.shape == (1, 5, 1, 8)


@pytest.mark.parametrize("mixer", MIXERS)
def test_scan_gradient_matches_finite_differences(x64, mixer):
  """The scan's autodiff gradient, which the chunk tests trust, against a central difference."""
  seed = seed_of("fd", mixer)
  inputs = make_inputs(mixer, 1, 6, 1, 4, value_dim(mixer, 4, 6), 0.5, "interior", seed, jnp.float64)
  o, final_state = call(mixer, inputs, output_final_state=True, use_qk_l2norm=True, impl="scan")
  r_o, r_s = cotangents(o.shape, final_state.shape, seed + 1, jnp.float64)

  def objective(arrays):
    return loss(*call(mixer, arrays, output_final_state=True, use_qk_l2norm=True, impl="scan"), r_o, r_s)

  grads = jax.grad(objective)(inputs)
  rng = np.random.default_rng(seed + 2)
  direction = {name: jnp.asarray(rng.standard_normal(x.shape)) for name, x in inputs.items()}
  eps = 1e-6
  shifted = [objective({n: x + sign * eps * direction[n] for n, x in inputs.items()}) for sign in (1, -1)]
  finite_difference = (shifted[0] - shifted[1]) / (2 * eps)
  analytic = sum(jnp.vdot(grads[n], direction[n]) for n in inputs)
  assert abs(analytic - finite_difference) <= 1e-7 * abs(finite_difference), (analytic, finite_difference)
