"""impl="chunk" under jax.jit against the scan, over fresh compiles, with no initial state and one chunk.

That case once gave wrong, compile-dependent outputs on the CPU (inf, NaN, 1e16 in roughly 4 compiles of 10; each
compile is deterministic, so one compile proves little): XLA:CPU's YNNPACK fusion folded the constant zero state
of the one-step scan into the dots as a broadcast scalar (`chunk.delta_rule_chunk` keeps it an array). Every T
below is its own program, so each is a fresh compile; eager calls were always exact.
"""

import jax

from sdm_jax import ops
from sdm_jax.testing.errors import relative_error

B, H, K = 1, 2, 32
TS = tuple(range(41, 49))  # each <= the chunk size 64: one chunk, so the scan over chunks is one step


def _inputs(T, seed):
  ks = jax.random.split(jax.random.key(seed), 5)
  q, k, v = (jax.random.normal(key, (B, T, H, K)) for key in ks[:3])
  g = -jax.random.uniform(ks[3], (B, T, H, K))
  beta = jax.nn.sigmoid(jax.random.normal(ks[4], (B, T, H)))
  return q, k, v, g, beta


def test_jitted_chunk_impl_matches_the_scan_over_fresh_compiles():
  kda = lambda impl: lambda *a: ops.kda(*a, use_qk_l2norm=True, impl=impl)[0]
  errors = {}
  for T in TS:
    inputs = _inputs(T, seed=T)
    reference = kda("scan")(*inputs)
    o = jax.jit(kda("chunk"))(*inputs)
    errors[T] = relative_error(o, reference)
  bad = {T: err for T, err in errors.items() if not err < 1e-5}  # `not <` so NaN counts as bad
  assert not bad, f"jitted impl='chunk' relative error against the scan above 1e-5 at T: {bad}"
