"""The five dense mixers of DESIGN.md section 1, each a few lines that build (u, e, z) and its entry in
`registry.MIXERS`; g goes to the rule as it is.

Shared signature: q, k [B, T, H, K]; v [B, T, H, V]; g the natural-log decay (<= 0); gates in
[0, 1]; a mixer's build takes k, v and the gates other than g. Keyword options: scale (default K**-0.5),
initial_state [B, H, K, V], output_final_state, use_qk_l2norm, impl in {"auto", "scan", "chunk", "pallas"} (default
"auto": "pallas" on a GPU, "chunk" elsewhere), chunk_size (a power of two, or None: the impl's rule,
`delta_rule.chunk_size_of`), segment_ids (None or int [B, T]: packed documents, DESIGN.md section 9;
`delta_rule.generalized_delta_rule`), lower_bound (None, or the caller's promise that every g >= lower_bound, with
which impl="pallas" forms its decayed grams in one or two dots; per-channel decays only, at most 160 / C below 0 for the
chunk size C impl="pallas" runs; `delta_rule.generalized_delta_rule`).
Returns (o [B, T, H, V] in v.dtype, final state [B, H, K, V] fp32, or None).
"""

import jax
import jax.numpy as jnp

from sdm_jax.ops.registry import Mixer, register


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


# The builds are module-level functions, so a mixer's build is the same object on every call: impl="pallas" hands
# it to jitted kernels as a static argument, and their compilations are then reused across eager calls. Each u and
# e is a product with k (`Mixer.writes_vanish_with_k`).
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


# The registry's entries: each public op is made from its mixer (`registry.Mixer.op`).
gated_delta_rule = register(Mixer(
    "gdn", "gated_delta_rule", _head_beta_build, decay="head", gates=(("beta", "head"),),
    writes_vanish_with_k=True,
    doc="""Gated DeltaNet: S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T.  g, beta: [B, T, H].""")).op

kda = register(Mixer(
    "kda", "kda", _head_beta_build, decay="key", gates=(("beta", "head"),),
    writes_vanish_with_k=True,
    doc="""Kimi Delta Attention: S_t = (I - beta_t k_t k_t^T) Diag(a_t) S_{t-1} + beta_t k_t v_t^T.

  g: [B, T, H, K]; beta: [B, T, H].
  """)).op

fg2_gdn = register(Mixer(
    "fg2_gdn", "fg2_gdn", _fg2_build, decay="key", gates=(("beta", "key"),),
    writes_vanish_with_k=True,
    equal_dims="beta scales both k and v; use fg2_gdn_plus for K != V",
    doc="""FG2-GDN: channel-wise learning rate, k~ = sqrt(beta) k, v~ = sqrt(beta) v (requires K == V).

  g, beta: [B, T, H, K].
  """)).op

fg2_gdn_plus = register(Mixer(
    "fg2_gdn_plus", "fg2_gdn_plus", _fg2_plus_build, decay="key", gates=(("beta_k", "key"), ("beta_v", "value")),
    writes_vanish_with_k=True,
    doc="""FG2-GDN+: k~ = sqrt(beta_k) k, v~ = sqrt(beta_v) v.  g, beta_k: [B, T, H, K]; beta_v: [B, T, H, V].""")).op

gdn2 = register(Mixer(
    "gdn2", "gdn2", _gdn2_build, decay="key", gates=(("b", "key"), ("w", "value")),
    writes_vanish_with_k=True,
    doc="""Gated DeltaNet-2: S_t = (I - k_t (b_t * k_t)^T) Diag(a_t) S_{t-1} + k_t (w_t * v_t)^T.

  g, b (erase gate): [B, T, H, K]; w (write gate): [B, T, H, V].
  """)).op
