"""The five dense mixers of SPEC.md section 1, each a few lines that build (u, e, z); g goes to the rule as it is.

Shared signature: q, k [B, T, H, K]; v [B, T, H, V]; g the natural-log decay (<= 0); gates in
[0, 1]; a mixer's build takes k, v and the gates other than g. Keyword options: scale (default K**-0.5),
initial_state [B, H, K, V], output_final_state, use_qk_l2norm, impl in {"auto", "scan", "chunk", "pallas"} (default
"auto": "pallas" on a GPU, "chunk" elsewhere), chunk_size (a power of two).
Returns (o [B, T, H, V] in v.dtype, final state [B, H, K, V] fp32, or None).
"""

import functools

import jax
import jax.numpy as jnp

from sdm_jax.ops.delta_rule import HEAD, KEY, VALUE, run_mixer


@jax.custom_jvp
def _sqrt_gate(x):
  return jnp.sqrt(x)


@_sqrt_gate.defjvp
def _sqrt_gate_jvp(primals, tangents):
  # d sqrt(x)/dx is unbounded at a gate of exactly 0; we take 0 there so a closed channel passes
  # no gradient instead of NaN (the forward never divides by sqrt(x)).
  (x,), (dx,) = primals, tangents
  y = jnp.sqrt(x)
  safe = jnp.where(x > 0, y, 1.0)
  return y, jnp.where(x > 0, 0.5 / safe, 0.0) * dx


def _options(fn):
  @functools.wraps(fn)
  def wrapped(*args, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm=False,
              impl="auto", chunk_size=64, **arrays):
    build, q, k, v, gates = fn(*args, **arrays)
    return run_mixer(build, q, k, v, gates, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm, impl=impl,
                     chunk_size=chunk_size)
  return wrapped


# The builds are module-level functions, so a mixer's build is the same object on every call: impl="pallas" hands
# it to jitted kernels as a static argument, and their compilations are then reused across eager calls.
def _head_beta_build(k, v, beta):
  return k, beta[..., None] * k, beta[..., None] * v


def _fg2_build(k, v, beta):
  root = _sqrt_gate(beta)
  return root * k, root * k, root * v


def _fg2_plus_build(k, v, beta_k, beta_v):
  root_k = _sqrt_gate(beta_k)
  return root_k * k, root_k * k, _sqrt_gate(beta_v) * v


def _gdn2_build(k, v, b, w):
  return k, b * k, w * v


@_options
def gated_delta_rule(q, k, v, g, beta):
  """Gated DeltaNet: S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T.  g, beta: [B, T, H]."""
  return _head_beta_build, q, k, v, {"g": (g, HEAD), "beta": (beta, HEAD)}


@_options
def kda(q, k, v, g, beta):
  """Kimi Delta Attention: S_t = (I - beta_t k_t k_t^T) Diag(a_t) S_{t-1} + beta_t k_t v_t^T.

  g: [B, T, H, K]; beta: [B, T, H].
  """
  return _head_beta_build, q, k, v, {"g": (g, KEY), "beta": (beta, HEAD)}


@_options
def fg2_gdn(q, k, v, g, beta):
  """FG2-GDN: channel-wise learning rate, k~ = sqrt(beta) k, v~ = sqrt(beta) v (requires K == V).

  g, beta: [B, T, H, K].
  """
  if k.shape[-1] != v.shape[-1]:
    raise ValueError(f"v: fg2_gdn requires K == V (beta scales both k and v), got K={k.shape[-1]}, "
                     f"V={v.shape[-1]}; use fg2_gdn_plus for K != V")
  return _fg2_build, q, k, v, {"g": (g, KEY), "beta": (beta, KEY)}


@_options
def fg2_gdn_plus(q, k, v, g, beta_k, beta_v):
  """FG2-GDN+: k~ = sqrt(beta_k) k, v~ = sqrt(beta_v) v.  g, beta_k: [B, T, H, K]; beta_v: [B, T, H, V]."""
  return _fg2_plus_build, q, k, v, {"g": (g, KEY), "beta_k": (beta_k, KEY), "beta_v": (beta_v, VALUE)}


@_options
def gdn2(q, k, v, g, b, w):
  """Gated DeltaNet-2: S_t = (I - k_t (b_t * k_t)^T) Diag(a_t) S_{t-1} + k_t (w_t * v_t)^T.

  g, b (erase gate): [B, T, H, K]; w (write gate): [B, T, H, V].
  """
  return _gdn2_build, q, k, v, {"g": (g, KEY), "b": (b, KEY), "w": (w, VALUE)}
