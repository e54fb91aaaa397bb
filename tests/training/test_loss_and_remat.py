"""The memory-saving paths are held to the plain ones on the CPU: the chunked cross-entropy against whole
logits, and every remat policy against none, on the loss and every gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sdm_jax.models import LanguageModel, default_config
from sdm_jax.models.lm import REMAT_POLICIES
from sdm_jax.models.loss import loss_fn, masked_cross_entropy, token_scores
from sdm_jax.testing.errors import relative_error

B, T, VOCAB = 2, 20, 48


def small_model(remat="none", pattern="DS", dtype="float32", impl="auto"):
  c = default_config()
  c.update(vocab_size=VOCAB, width=32, num_heads=2, head_dim=16, value_dim=8, pattern=pattern, num_layers=len(pattern),
           chunk_size=16, window=6, remat=remat, dtype=dtype, impl=impl,
           sdm=dict(num_slots=64, topk_write=4, topk_read=3, key_dim=8, value_dim=8, chunk_size=8, impl=impl))
  return LanguageModel(c, rngs=nnx.Rngs(0))


def batch(seed):
  keys = jax.random.split(jax.random.key(seed), 3)
  tokens = jax.random.randint(keys[0], (B, T), 0, VOCAB, jnp.int32)
  targets = jax.random.randint(keys[1], (B, T), 0, VOCAB, jnp.int32)
  mask = (jax.random.uniform(keys[2], (B, T)) < 0.7).astype(jnp.float32)
  return {"inputs": tokens, "targets": targets, "mask": mask}


def plain_loss(model, batch):
  return masked_cross_entropy(model(batch["inputs"]), batch["targets"], batch["mask"])


def grads_of(fn, model, batch):
  (loss, metrics), grads = nnx.jit(nnx.value_and_grad(fn, has_aux=True))(model, batch)
  return loss, metrics, {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(grads)}


@pytest.mark.parametrize("chunk_tokens", (7, 16, 40, 1000), ids=("ragged", "even", "whole", "larger"))
def test_chunked_scores_match_whole_logits(chunk_tokens):
  keys = jax.random.split(jax.random.key(1), 3)
  features = jax.random.normal(keys[0], (B, T, 32), jnp.float32)
  kernel = jax.random.normal(keys[1], (32, VOCAB), jnp.float32)
  targets = jax.random.randint(keys[2], (B, T), 0, VOCAB, jnp.int32)
  cotangent = jax.random.normal(jax.random.key(2), (B, T), jnp.float32)

  def chunked(features, kernel):
    nll, correct = token_scores(features, kernel, targets, chunk_tokens)
    return jnp.sum(nll * cotangent), correct

  def whole(features, kernel):
    logits = jnp.einsum("btd,dv->btv", features, kernel)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    return jnp.sum(nll * cotangent), jnp.argmax(logits, -1) == targets

  (value, correct), grads = jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True)(features, kernel)
  (ref_value, ref_correct), ref_grads = jax.value_and_grad(whole, argnums=(0, 1), has_aux=True)(features, kernel)
  assert abs(float(value - ref_value)) <= 1e-5 * abs(float(ref_value))
  np.testing.assert_array_equal(correct, ref_correct)
  for g, ref in zip(grads, ref_grads):
    assert relative_error(g, ref) < 1e-5


def test_model_loss_matches_the_plain_loss():
  model, b = small_model(pattern="S"), batch(3)  # the loss does not depend on the mixer
  loss, metrics, grads = grads_of(lambda m, b: loss_fn(m, b, chunk_tokens=9), model, b)
  ref_loss, ref_metrics, ref_grads = grads_of(plain_loss, model, b)
  assert abs(float(loss - ref_loss)) < 1e-5 * float(ref_loss)
  for key in ("accuracy", "exact_match", "tokens", "sequences"):
    assert float(metrics[key]) == float(ref_metrics[key]), key
  assert grads.keys() == ref_grads.keys()
  for name, ref in ref_grads.items():
    assert relative_error(grads[name], ref) < 1e-5, name


@pytest.fixture(scope="module")
def no_remat_reference():
  """The loss and gradients without remat, computed once for every policy's test."""
  ref_loss, _, ref_grads = grads_of(loss_fn, small_model("none"), batch(4))
  return ref_loss, ref_grads


@pytest.mark.parametrize("remat", [p for p in REMAT_POLICIES if p != "none"])
def test_remat_policies_give_the_plain_loss_and_gradients(remat, no_remat_reference):
  ref_loss, ref_grads = no_remat_reference
  loss, _, grads = grads_of(loss_fn, small_model(remat), batch(4))
  assert abs(float(loss - ref_loss)) < 1e-6 * float(ref_loss)
  for name, ref in ref_grads.items():
    assert relative_error(grads[name], ref) < 1e-5, name


def test_unknown_remat_policy_is_refused():
  with pytest.raises(ValueError, match="remat: expected one of"):
    small_model("everything")


@pytest.mark.parametrize("pattern", ["D", "M"])
def test_dots_kernels_keeps_the_pallas_results_and_gives_the_plain_gradients(pattern):
  # On the CPU impl="auto" is "chunk" and no Pallas kernel runs; here the kernels run in interpret mode, so the
  # policy's pallas_call branch is what is exercised (and, for the SDM layer "M", its kept slots).
  b = batch(5)
  ref_loss, _, ref_grads = grads_of(loss_fn, small_model("none", pattern=pattern, impl="pallas"), b)
  loss, _, grads = grads_of(loss_fn, small_model("dots_kernels", pattern=pattern, impl="pallas"), b)
  assert abs(float(loss - ref_loss)) < 1e-6 * float(ref_loss)
  for name, ref in ref_grads.items():
    assert relative_error(grads[name], ref) < 1e-5, name


def _top_k_count(model, b):
  graphdef, state = nnx.split(model)
  grad = jax.grad(lambda s: loss_fn(nnx.merge(graphdef, s), b)[0])
  return str(jax.make_jaxpr(grad)(state)).count("top_k[")


def test_dots_kernels_keeps_the_sdm_slots():
  """The SDM layer's backward under "dots_kernels" selects no slots again: as many top-k as without remat (its
  forward's), where "dots" runs them again."""
  b = batch(5)
  counts = {remat: _top_k_count(small_model(remat, pattern="M"), b) for remat in ("none", "dots_kernels", "dots")}
  assert counts["none"] > 0
  assert counts["dots_kernels"] == counts["none"]
  assert counts["dots"] == 2 * counts["none"]
