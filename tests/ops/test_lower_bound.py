"""lower_bound, the caller's promise g >= lower_bound (DESIGN.md section 2): impl="pallas" (interpret mode on CPU)
forms its decayed grams with one or two dots each and is held to the scan with the tolerances of the unbounded path
(`errors.TOLERANCES`), outputs, final state and every gradient: g at the bound everywhere and mixed between it and 0,
chunk 16 and 32, fp32 and bf16 inputs, packed documents, a loss of 1 and of 1e-6; the bound reaches gram_solve, and
pair_bwd where its settings ask (`bounded_pairs`, held to the split it replaces); the ValueErrors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.chunk_math import lowest_bound
from pallas_kernels.delta_rule_bwd import IntraChunkBwdSettings, intra_chunk_bwd, state_pass_bwd
from pallas_kernels.delta_rule_fwd import chunk_cumsum, intra_chunk, state_pass
from pallas_kernels.launch import Shape
from sdm_jax import ops
from sdm_jax.ops.segments import chunk_documents
from sdm_jax.testing.errors import TOLERANCES, assert_close, relative_error, results
from sdm_jax.testing.inputs import cast, cotangents, make_inputs, seed_of, segment_ids
from sdm_jax.testing.runs import call, loss, value_dim

B, H, K, V = 2, 2, 16, 32
# Each case: (mixer, chunk size, g, io dtype, packed, the loss's scale). g: "bound", the lowest bound the chunk size
# takes everywhere (the halves of the chunk one dot each, the tree's top level across them); "mixed", between that
# bound and 0; "one dot", half that bound everywhere (the whole chunk in one dot). The loss scaled by 1e-6: what the
# factors lose to flushed subnormals must not grow as the cotangents shrink. The per-channel mixers share the grams;
# their gates reach them through u and e alone.
CASES = [
    ("kda", 16, "bound", "float32", False, 1e-6),
    ("gdn2", 32, "mixed", "float32", False, 1.0),
    ("fg2_gdn_plus", 32, "one dot", "float32", False, 1e-6),
    ("kda", 32, "mixed", "bfloat16", False, 1e-6),
    ("gdn2", 16, "bound", "bfloat16", False, 1.0),
    ("kda", 32, "one dot", "bfloat16", False, 1.0),
    ("gdn2", 16, "mixed", "float32", True, 1.0),
    ("kda", 32, "bound", "float32", True, 1e-6),
]


def _inputs(mixer, T, chunk_size, decay, seed, dtype=jnp.float32):
  """(make_inputs's with g as `decay` says (CASES), the lower bound)."""
  inputs = make_inputs(mixer, B, T, H, K, value_dim(mixer, K, V), 1.0, "random", seed, dtype)
  rng = np.random.default_rng(seed)
  bound = lowest_bound(chunk_size) * (0.5 if decay == "one dot" else 1.0)
  shape = inputs["g"].shape
  g = bound * rng.uniform(size=shape) * (rng.uniform(size=shape) < 0.8) if decay == "mixed" else np.full(shape, bound)
  return {**inputs, "g": jnp.asarray(g, dtype)}, bound


@pytest.mark.parametrize("mixer, chunk_size, decay, dtype, packed, loss_scale", CASES,
                         ids=["-".join(map(str, case[:4])) + ("-packed" if case[4] else "") + f"-loss{case[5]:g}"
                              for case in CASES])
def test_bounded_pallas_matches_the_scan(x64, mixer, chunk_size, decay, dtype, packed, loss_scale):
  """fp32 inputs against the float64 scan, bf16 ones against the fp32 scan on the same bf16-rounded values (DESIGN.md
  section 6), with the tolerances of impl="pallas" without a bound."""
  T = 3 * chunk_size - 5  # the last chunk padded
  seed = seed_of("lower_bound", mixer, chunk_size, decay, dtype, packed)
  inputs, bound = _inputs(mixer, T, chunk_size, decay, seed, jnp.float64)
  Vm = value_dim(mixer, K, V)
  r_o, r_s = (loss_scale * r for r in cotangents((B, T, H, Vm), (B, H, K, Vm), seed + 1, jnp.float64))
  # Packed: documents starting inside chunks and at a chunk boundary, then padding.
  ids = segment_ids((((0, 7), (7, chunk_size), (chunk_size, T - 3)), ((0, T),)), B, T) if packed else None
  options = dict(use_qk_l2norm=True, segment_ids=ids)
  ours = cast(inputs, jnp.dtype(dtype))
  reference_dtype = jnp.float64 if dtype == "float32" else jnp.float32
  actual = results(*_outputs_and_grads(mixer, ours, r_o.astype(jnp.float32), r_s.astype(jnp.float32), impl="pallas",
                                       chunk_size=chunk_size, lower_bound=bound, **options))
  reference = results(*_outputs_and_grads(mixer, cast(ours, reference_dtype), r_o.astype(reference_dtype),
                                          r_s.astype(reference_dtype), impl="scan", **options))
  assert_close(actual, reference, TOLERANCES[dtype]["pallas"],
               f"pallas with lower_bound={bound} vs the scan, {mixer} C={chunk_size} g {decay} {dtype}")
  if decay == "bound":  # the forward without gradients, whose kernels form u, e, z themselves
    o, final_state = jax.jit(lambda a: call(mixer, a, impl="pallas", chunk_size=chunk_size, lower_bound=bound,
                                            output_final_state=True, **options))(ours)
    assert_close({"o": o, "final_state": final_state}, {n: reference[n] for n in ("o", "final_state")},
                 TOLERANCES[dtype]["pallas"][0], f"the forward alone, {mixer} C={chunk_size} {dtype}")


def _outputs_and_grads(mixer, inputs, r_o, r_s, **options):
  """`runs.outputs_and_grads` with options that may hold arrays (segment_ids), closed over rather than cached on."""
  def objective(arrays, r_o, r_s):
    o, final_state = call(mixer, arrays, output_final_state=True, **options)
    return loss(o, final_state, r_o, r_s), (o, final_state)

  grads, (o, final_state) = jax.jit(jax.grad(objective, has_aux=True))(inputs, r_o, r_s)
  return o, final_state, grads


def _kernel_programs(fn, *args):
  """{name: the jaxpr of that Pallas launch} in the jaxpr of fn(*args)."""
  found = {}

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "pallas_call":
        found[eqn.params["name"]] = eqn.params["jaxpr"]
      for param in eqn.params.values():
        for sub in param if isinstance(param, (list, tuple)) else [param]:
          if isinstance(sub, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
            walk(getattr(sub, "jaxpr", sub))

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def _loops(jaxpr):
  """The loops (scan or while) in a kernel's jaxpr, nested ones included."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name in ("scan", "while")
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        if isinstance(sub, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
          count += _loops(getattr(sub, "jaxpr", sub))
  return count


def test_the_bound_reaches_gram_solve_and_pair_bwd():
  """With the bound the forward's gram_solve does not loop over the sub-blocks' elementwise pairs (only over key
  blocks); pair_bwd does unless its settings ask for the bounded pairs (bounded_pairs, not the default)."""
  inputs = make_inputs("kda", 1, 32, 1, K, K, 1.0, "random", seed_of("reach"))
  loops = {}
  for bound in (None, -1.0):
    loss = lambda a, bound=bound: jnp.sum(call("kda", a, impl="pallas", chunk_size=16, lower_bound=bound)[0])
    programs = _kernel_programs(jax.grad(loss), inputs)
    loops[bound] = {name: _loops(programs[name]) for name in ("delta_rule_gram_solve", "delta_rule_pair_bwd")}
  assert loops == {None: {"delta_rule_gram_solve": 2, "delta_rule_pair_bwd": 1},
                   -1.0: {"delta_rule_gram_solve": 1, "delta_rule_pair_bwd": 1}}


@pytest.mark.parametrize("dtype, loss_scale", [(jnp.float32, 1e-6), (jnp.bfloat16, 1.0)])
def test_pair_bwd_s_bounded_pairs_give_the_split_s_gradients(dtype, loss_scale):
  """intra_chunk_bwd with settings.bounded_pairs (pass 4 differentiating the bounded dots) against its default
  (the binary split), g between the lowest bound of chunk 32 and 0, packed, the cotangents scaled by loss_scale."""
  C, B, T, H = 32, 1, 96, 2
  shape = Shape(B=B, T=T, H=H, K=K, V=K, dtype=jnp.dtype(dtype).name, chunk_size=C)
  bound = lowest_bound(C)
  rng = np.random.default_rng(seed_of("bounded pairs"))
  normal = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
  q, u, z = normal(B, T, H, K), normal(B, T, H, K) / np.sqrt(K), normal(B, T, H, K)
  e = u * jnp.asarray(rng.uniform(size=(B, T, H, 1)), jnp.float32)
  g = jnp.asarray(rng.uniform(bound, 0.0, size=(B, T, H, K)), jnp.float32)
  q, u, e, z = (x.astype(dtype) for x in (q, u, e, z))
  documents = chunk_documents(jnp.zeros((B, T), bool).at[:, [7, C + 20]].set(True), C)
  kw = dict(chunk_size=C, interpret=True)
  G = chunk_cumsum(g, C, True)
  chunks = intra_chunk(q, (u, z, e), G, scale=K**-0.5, save_inverse=True, lower_bound=bound, documents=documents,
                       **kw)
  _, _, states, r = state_pass(chunks, jnp.zeros((B, H, K, K), jnp.float32), save_states=True, **kw)
  d_o = (loss_scale * normal(B, T, H, K)).astype(dtype)
  d_r, _, d_states = state_pass_bwd(chunks, d_o, jnp.zeros((B, H, K, K), jnp.float32), **kw)
  grads = {}
  for bounded in (False, True):
    settings = dataclasses.replace(IntraChunkBwdSettings.defaults(shape), bounded_pairs=bounded)
    grads[bounded] = intra_chunk_bwd(q, u, e, z, G, r, chunks.A, states, d_states, d_o, d_r, scale=K**-0.5,
                                     lower_bound=bound, documents=documents, settings=settings, **kw)
  tolerance = 1e-5 if dtype == jnp.float32 else 1e-2
  for name, split, dots in zip(("dq", "du", "de", "dz", "dg"), grads[False], grads[True]):
    assert relative_error(dots, split) <= tolerance, name
  assert not np.array_equal(grads[False][4], grads[True][4])  # two computations: the setting reached pass 4


def test_the_other_impls_take_the_bound_and_compute_the_same():
  inputs, bound = _inputs("gdn2", 40, 32, "mixed", seed_of("other impls"))
  for impl in ("chunk", "scan"):
    run = lambda lower_bound, impl=impl: call("gdn2", inputs, impl=impl, lower_bound=lower_bound,
                                              output_final_state=True)
    assert_close(results(*run(bound)), results(*run(None)), 0.0, f"{impl} with and without the bound")


@pytest.mark.parametrize("impl", ["pallas", "chunk", "scan", "auto"])
def test_bad_bounds_raise_whatever_impl_runs(impl):
  """Checked at the chunk size impl="pallas" runs (the given one, or its rule's 32), whatever impl runs, so a call
  one impl takes every impl takes."""
  inputs, _ = _inputs("kda", 20, 32, "mixed", seed_of("bad bounds"))
  words = lambda text: rf"^lower_bound: expected None {text}"
  for bound, chunk_size, message in ((0.0, None, words(r"or a number in \[-5, 0\) at chunk size 32")),
                                     (1.0, 16, words(r"or a number in \[-10, 0\) at chunk size 16")),
                                     (-5.5, None, words(r"or a number in \[-5, 0\) at chunk size 32")),
                                     (-5.0, 64, words(r"or a number in \[-2.5, 0\) at chunk size 64")),
                                     ("-1", None, words("or a number")),
                                     (jnp.float32(-1.0), None, words("or a number"))):
    with pytest.raises(ValueError, match=message):
      call("kda", inputs, impl=impl, chunk_size=chunk_size, lower_bound=bound)
  gdn = make_inputs("gdn", B, 20, H, K, V, 1.0, "random", seed_of("bad bounds gdn"))
  with pytest.raises(ValueError, match=words("with one decay per head")):
    call("gdn", gdn, impl=impl, lower_bound=-1.0)
  with pytest.raises(ValueError, match=words("with one decay per head")):
    ops.generalized_delta_rule(gdn["q"], gdn["k"], gdn["k"], gdn["v"], gdn["g"], impl=impl, lower_bound=-1.0)
