"""Token-by-token `lax.scan` of the generalized delta rule: the ground truth every fast path is held to."""

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def delta_rule_scan(q, u, e, z, g, scale, initial_state, starts=None):
  """S_t = (I - u_t e_t^T) Diag(exp(g_t)) S_{t-1} + u_t z_t^T,  o_t = scale * S_t^T q_t.

  q, u, e, g: [B, T, H, K]; z: [B, T, H, V]; initial_state: [B, H, K, V].
  All inputs already in the accumulation dtype. starts: None or [B, T] bool, the tokens where a packed document
  starts (DESIGN.md section 9): S_{t-1} is replaced by 0 there. Returns (o [B, T, H, V], S_T [B, H, K, V]).
  """

  def step(state, xs):
    q_t, u_t, e_t, z_t, g_t, *start_t = xs  # [B, H, K] / [B, H, V]; start_t [B]
    if start_t:
      state = jnp.where(start_t[0][:, None, None, None], jnp.zeros((), state.dtype), state)
    state = jnp.exp(g_t)[..., None] * state
    # The delta rule's new value: what is written minus what the erase key reads back.
    delta = z_t - jnp.einsum("bhk,bhkv->bhv", e_t, state, precision=HIGHEST)
    state = state + u_t[..., None] * delta[..., None, :]
    o_t = scale * jnp.einsum("bhk,bhkv->bhv", q_t, state, precision=HIGHEST)
    return state, o_t

  time_major = [jnp.moveaxis(x, 1, 0) for x in (q, u, e, z, g) + (() if starts is None else (starts,))]
  final_state, o = jax.lax.scan(step, initial_state, time_major)
  return jnp.moveaxis(o, 0, 1), final_state
