"""Chunkwise-parallel (WY) form of the generalized delta rule in pure JAX (DESIGN.md section 2).

Intra-chunk work is vectorised across all chunks; only the carried state is a `lax.scan` over
chunks. Every decay exponent is a sum of exactly the log decays it spans, built from 16-row
sub-chunk partial sums, never a difference of two large cumsums: so every exponent is <= 0
(strong decay, g ~ -30 per step, stays finite), an empty span is a structural 0 with no gradient
path, and d/dg keeps its precision when the true gradient is as small as exp(-30).
"""

import jax
import jax.numpy as jnp

from sdm_jax.ops.segments import chunk_documents

HIGHEST = jax.lax.Precision.HIGHEST
SUB_CHUNK = 16
# impl="chunk"'s rule when the op is not told a chunk size: 64, clamped to the sequence's padded length
# (`validation.chunk_size_for`). Not chosen by a GPU measurement: this form is the CPU path and the kernels'
# reference, and its result does not depend on the size.
CHUNK_SIZE = 64


def _einsum(spec, *xs):
  return jnp.einsum(spec, *xs, precision=HIGHEST)


def _spans(g, sub):
  """Partial sums of the log decay g [..., C, K] over 16-row sub-chunks (n = C / sub of them).

  Returns a dict of
    inclusive [..., n, s, K]: sum of g over rows <= r within r's sub-chunk
    suffix    [..., n, s, K]: sum over rows > r within r's sub-chunk
    before    [..., n, K]:    sum over earlier sub-chunks;   after [..., n, K]: over later ones
    between   [..., n, n, K]: [i, j] sums the sub-chunks strictly between j and i (j < i)
    within    [..., n, s, s, K]: [r, c] sums rows c < j <= r of one sub-chunk (0 for r <= c)
    total     [..., K]
  """
  *lead, C, K = g.shape
  n = C // sub
  gb = g.reshape(*lead, n, sub, K)
  r = jnp.arange(sub)
  m = jnp.arange(n)
  as_f = lambda mask: mask.astype(g.dtype)
  sub_totals = jnp.sum(gb, axis=-2)
  later = m[:, None] < m[None, :]
  within = jnp.where(r[:, None, None] > r[None, :, None], gb[..., :, :, None, :], 0.0)
  return {
      "inclusive": _einsum("rj,...ijk->...irk", as_f(r[:, None] >= r[None, :]), gb),
      "suffix": _einsum("rj,...ijk->...irk", as_f(r[:, None] < r[None, :]), gb),
      "before": _einsum("im,...mk->...ik", as_f(later.T), sub_totals),
      "after": _einsum("im,...mk->...ik", as_f(later), sub_totals),
      "between": _einsum("ijm,...mk->...ijk", as_f(later.T[:, None, :] & later[None, :, :]), sub_totals),
      "within": jnp.cumsum(within, axis=-3),
      "total": jnp.sum(sub_totals, axis=-2),
  }


def _decayed_grams(q, e, u, spans, sub):
  """T[r, c] = sum_k e[r,k] u[c,k] exp(G_r - G_c) for c < r and Aqk[r, c] likewise with q for c <= r.

  q, e, u: [..., C, K]. Returns (T, Aqk), each [..., C, C], zero above the diagonal.
  """
  *lead, C, K = q.shape
  n = C // sub
  qb, eb, ub = (x.reshape(*lead, n, sub, K) for x in (q, e, u))

  # Row r of sub-chunk i against column c of an earlier sub-chunk j: the span splits into the
  # rows of i up to r, the sub-chunks between, and the rows of j after c.
  row_decay = jnp.exp(spans["inclusive"])
  earlier = (jnp.arange(n)[:, None] > jnp.arange(n)[None, :])[:, :, None, None]  # [i, j, 1, 1]
  expo = jnp.where(earlier, spans["suffix"][..., None, :, :, :] + spans["between"][..., :, :, None, :], 0.0)
  col = jnp.where(earlier, ub[..., None, :, :, :] * jnp.exp(expo), 0.0)  # [..., i, j, s, K]
  off = lambda x: _einsum("...irk,...ijck->...irjc", x * row_decay, col).reshape(*lead, C, C)

  # Within a sub-chunk: the exact pairwise span, zero (masked) on and above the diagonal.
  r = jnp.arange(sub)
  causal = (r[:, None] >= r[None, :])[:, :, None]
  decay = jnp.where(causal, jnp.exp(spans["within"]), 0.0)  # [..., n, s, s, K]
  strict = (r[:, None] > r[None, :]).astype(q.dtype)
  eye_n = jnp.eye(n, dtype=q.dtype)[:, None, :, None]
  place = lambda d: (d[..., :, :, None, :] * eye_n).reshape(*lead, C, C)
  diag_t = _einsum("...irk,...ick,...irck->...irc", eb, ub, decay) * strict
  diag_qk = _einsum("...irk,...ick,...irck->...irc", qb, ub, decay)
  return off(eb) + place(diag_t), off(qb) + place(diag_qk)


def chunk_intra(q, u, e, z, g, scale, chunk_size, starts=None):
  """Everything of the chunked form that is parallel over chunks.

  q, u, e, g: [B, T, H, K]; z: [B, T, H, V]; starts: None or [B, T] bool, where packed documents start (the
  state is reset to 0 before them, so their g has no effect). Returns the per-chunk tensors the state pass consumes, by
  the names of `pallas_kernels.delta_rule_fwd.ChunkTensors` but laid out [B, H, N, C, D] (N = ceil(T / C); padded
  tokens have g = 0 and write nothing):
    Y = A (e * exp(G)), U = A z, u_decayed = u * exp(G_C - G), q_decayed = scale * q * exp(G),
    Aqk [B, H, N, C, C], decay_last = exp(G_C) [B, H, N, K, 1].
  With starts, every decay that spans a document start is 0: a pair (r, c) of T and Aqk unless both rows are in
  one document, exp(G) on rows after a start in the chunk (they do not see the state entering it), exp(G_C - G)
  on rows before the chunk's last start, exp(G_C) if the chunk has a start. The masks are 0/1 per row or pair,
  so they multiply the grams after their sum over channels and every exponent stays as it is.
  """
  B, T, H, K = q.shape
  C = chunk_size
  N = -(-T // C)
  sub = min(SUB_CHUNK, C)

  def to_chunks(x):  # [B, T, H, D] -> [B, H, N, C, D]
    x = jnp.pad(x, ((0, 0), (0, N * C - T), (0, 0), (0, 0)))
    return x.reshape(B, N, C, H, -1).transpose(0, 3, 1, 2, 4)

  q, u, e, z, g = map(to_chunks, (q * scale, u, e, z, g))
  spans = _spans(g, sub)
  T_mat, Aqk = _decayed_grams(q, e, u, spans, sub)
  by_row = lambda x: x.reshape(B, H, N, C, K)
  G = by_row(spans["before"][..., :, None, :] + spans["inclusive"])  # G_r, the cumsum to row r
  G_to_end = by_row(spans["suffix"] + spans["after"][..., :, None, :])  # G_C - G_r
  decay_in, decay_out, decay_last = jnp.exp(G), jnp.exp(G_to_end), jnp.exp(spans["total"])[..., :, None]
  if starts is not None:
    documents = chunk_documents(jnp.pad(starts, ((0, 0), (0, N * C - T))), C).reshape(B, 1, N, C, 1)
    last = documents[..., C - 1:, :]
    zero = jnp.zeros((), q.dtype)
    same = documents == jnp.swapaxes(documents, -1, -2)  # [B, 1, N, C, C]
    T_mat, Aqk = jnp.where(same, T_mat, zero), jnp.where(same, Aqk, zero)
    decay_in = jnp.where(documents == 0, decay_in, zero)
    decay_out = jnp.where(documents == last, decay_out, zero)
    decay_last = jnp.where(last[..., 0, :, None] == 0, decay_last, zero)

  # A = (I + T)^-1 applied by an exact unit-lower-triangular solve: Y = A (e * exp(G)), U = A z.
  eye = jnp.eye(C, dtype=q.dtype)
  rhs = jnp.concatenate([e * decay_in, z], axis=-1)
  sol = jax.lax.linalg.triangular_solve(eye + T_mat, rhs, left_side=True, lower=True, unit_diagonal=True)
  return {"Y": sol[..., :K], "U": sol[..., K:], "u_decayed": u * decay_out, "q_decayed": q * decay_in,
          "Aqk": Aqk, "decay_last": decay_last}


def chunk_step(state, chunk):
  """One chunk of the state pass: (state entering, chunk tensors without the N axis) -> (state leaving, o)."""
  R = chunk["U"] - _einsum("bhck,bhkv->bhcv", chunk["Y"], state)
  o = _einsum("bhck,bhkv->bhcv", chunk["q_decayed"], state) + _einsum("bhcs,bhsv->bhcv", chunk["Aqk"], R)
  return chunk["decay_last"] * state + _einsum("bhck,bhcv->bhkv", chunk["u_decayed"], R), o


def from_chunks(o, T):
  """[B, H, N, C, V] -> [B, T, H, V]."""
  B, H, N, C, V = o.shape
  return o.transpose(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]


def delta_rule_chunk(q, u, e, z, g, scale, initial_state, chunk_size, starts=None):
  """Same contract as `delta_rule_scan`; the result does not depend on `chunk_size`.

  q, u, e, g: [B, T, H, K]; z: [B, T, H, V]; initial_state: [B, H, K, V]; starts: None or [B, T] bool.
  """
  chunks = chunk_intra(q, u, e, z, g, scale, chunk_size, starts)
  # Under jit, XLA:CPU's YNNPACK fusion (jaxlib 0.11) computes wrong, compile-dependent outputs (inf, NaN, 1e16)
  # when a constant zero state (initial_state=None) is folded into the dots of a one-chunk scan as a broadcast
  # scalar; the barrier keeps the state an array the dots read.
  initial_state = jax.lax.optimization_barrier(initial_state)
  final_state, o = jax.lax.scan(chunk_step, initial_state, jax.tree.map(lambda x: jnp.moveaxis(x, 2, 0), chunks))
  return from_chunks(jnp.moveaxis(o, 0, 2), q.shape[1]), final_state
