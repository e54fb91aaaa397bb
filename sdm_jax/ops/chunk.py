"""Chunkwise-parallel (WY) form of the generalized delta rule in pure JAX (SPEC.md section 2).

Intra-chunk work is vectorised across all chunks; only the carried state is a `lax.scan` over
chunks. Every exponent is <= 0: decays are taken relative to the inclusive cumsum G inside a
chunk, and between sub-chunks relative to a reference point G_ref that lies between the row and
the column, so exp(-G) is never formed and strong decay (g ~ -30 per step) stays finite.
"""

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST
SUB_CHUNK = 16


def _einsum(spec, *xs):
  return jnp.einsum(spec, *xs, precision=HIGHEST)


def _decayed_gram(x, u, G, G_ref, sub, inclusive):
  """M[r, c] = sum_k x[r, k] u[c, k] exp(G[r, k] - G[c, k]) for c < r (c <= r if inclusive), else 0.

  x, u, G: [..., C, K]; G_ref: [..., n, K], the cumsum just before each sub-chunk of `sub` rows.
  """
  *lead, C, K = x.shape
  n = C // sub
  xb, ub, Gb = (a.reshape(*lead, n, sub, K) for a in (x, u, G))

  # Columns in earlier sub-chunks: G[r] <= G_ref[i] <= G[c], so both factors are <= 1.
  left = xb * jnp.exp(Gb - G_ref[..., :, None, :])
  earlier = jnp.arange(C)[None, :] < (jnp.arange(n) * sub)[:, None]  # [n, C]
  earlier = earlier[:, :, None]
  expo = jnp.where(earlier, G_ref[..., :, None, :] - G[..., None, :, :], 0.0)
  right = jnp.where(earlier, u[..., None, :, :] * jnp.exp(expo), 0.0)  # [..., n, C, K]
  off = _einsum("...isk,...ick->...isc", left, right).reshape(*lead, C, C)

  # Within a sub-chunk: exact pairwise decay, masked before exp (double where).
  r = jnp.arange(sub)
  tri = (r[:, None] >= r[None, :]) if inclusive else (r[:, None] > r[None, :])
  tri = tri[:, :, None]
  expo = jnp.where(tri, Gb[..., :, None, :] - Gb[..., None, :, :], 0.0)  # [..., n, s, s, K]
  decay = jnp.where(tri, jnp.exp(expo), 0.0)
  diag = _einsum("...irk,...ick,...irck->...irc", xb, ub, decay)  # [..., n, s, s]
  eye_n = jnp.eye(n, dtype=x.dtype)
  diag = (diag[..., :, :, None, :] * eye_n[:, None, :, None]).reshape(*lead, C, C)
  return off + diag


def delta_rule_chunk(q, u, e, z, g, scale, initial_state, chunk_size):
  """Same contract as `delta_rule_scan`; the result does not depend on `chunk_size`.

  q, u, e, g: [B, T, H, K]; z: [B, T, H, V]; initial_state: [B, H, K, V].
  """
  B, T, H, K = q.shape
  V = z.shape[-1]
  C = chunk_size
  N = -(-T // C)
  sub = min(SUB_CHUNK, C)

  def to_chunks(x):  # [B, T, H, D] -> [B, H, N, C, D]; padded tokens have g = 0 and write nothing
    x = jnp.pad(x, ((0, 0), (0, N * C - T), (0, 0), (0, 0)))
    return x.reshape(B, N, C, H, -1).transpose(0, 3, 1, 2, 4)

  q, u, e, z, g = map(to_chunks, (q * scale, u, e, z, g))
  G = jnp.cumsum(g, axis=-2)
  Gb = G.reshape(*G.shape[:-2], C // sub, sub, K)
  G_ref = jnp.concatenate([jnp.zeros_like(Gb[..., :1, 0, :]), Gb[..., :-1, -1, :]], axis=-2)

  T_mat = _decayed_gram(e, u, G, G_ref, sub, inclusive=False)
  A_qk = _decayed_gram(q, u, G, G_ref, sub, inclusive=True)
  # A = (I + T)^-1 applied by an exact fp32 unit-lower-triangular solve: Y = A (e * exp(G)), U = A z.
  eye = jnp.eye(C, dtype=q.dtype)
  rhs = jnp.concatenate([e * jnp.exp(G), z], axis=-1)
  sol = jax.lax.linalg.triangular_solve(eye + T_mat, rhs, left_side=True, lower=True, unit_diagonal=True)
  Y, U = sol[..., :K], sol[..., K:]
  G_last = G[..., -1:, :]
  W = u * jnp.exp(G_last - G)  # decay from each row to the chunk end
  q_decayed = q * jnp.exp(G)
  decay_last = jnp.exp(G_last)[..., 0, :, None]  # [B, H, N, K, 1]

  def step(state, xs):
    Y, U, W, q_decayed, A_qk, decay_last = xs
    R = U - _einsum("bhck,bhkv->bhcv", Y, state)
    o = _einsum("bhck,bhkv->bhcv", q_decayed, state) + _einsum("bhcs,bhsv->bhcv", A_qk, R)
    state = decay_last * state + _einsum("bhck,bhcv->bhkv", W, R)
    return state, o

  xs = [jnp.moveaxis(x, 2, 0) for x in (Y, U, W, q_decayed, A_qk, decay_last)]
  final_state, o = jax.lax.scan(step, initial_state, xs)  # o: [N, B, H, C, V]
  o = o.transpose(1, 0, 3, 2, 4).reshape(B, N * C, H, V)[:, :T]
  return o, final_state
