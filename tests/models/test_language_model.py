"""The language model: every pattern letter wires up causally, CE-loss gradients are finite and reach
every parameter, bf16 compute tracks fp32, and the parameter count and weight-decay mask are exact."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from model_helpers import small_config
from sdm_jax.models import LanguageModel, count_params, default_config, layer_letters, no_decay_mask
from sdm_jax.testing.errors import relative_error

B, T = 2, 24


def tokens(seed, vocab=64):
  return jax.random.randint(jax.random.key(seed), (B, T), 0, vocab, jnp.int32)


def cross_entropy(model, tokens):
  logits = model(tokens[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def flat(state):
  return {"/".join(map(str, path)): leaf.get_value() for path, leaf in nnx.to_flat_state(state)}


@pytest.mark.parametrize("pattern, mixer", [("DDDD", "gdn"), ("DSDS", "gdn2"), ("DDDA", "fg2_gdn_plus"),
                                            ("SSSM", "kda")])
def test_loss_and_gradients_are_finite_and_reach_every_parameter(pattern, mixer):
  model = LanguageModel(small_config(pattern, mixer), rngs=nnx.Rngs(0))
  loss, grads = nnx.jit(nnx.value_and_grad(cross_entropy))(model, tokens(1))
  # An untrained model predicts roughly uniformly over the 64 tokens.
  assert abs(float(loss) - np.log(64)) < 1.0
  for name, g in flat(grads).items():
    assert bool(jnp.all(jnp.isfinite(g))), name
    assert float(jnp.abs(g).max()) > 0, name


def test_every_letter_is_causal():
  model = LanguageModel(small_config("DSAM"), rngs=nnx.Rngs(0))
  run = nnx.jit(lambda model, tokens: model(tokens))
  t = 13
  x = tokens(2)
  x_changed = x.at[:, t].set((x[:, t] + 1) % 64)
  logits, logits_changed = run(model, x), run(model, x_changed)
  assert logits.shape == (B, T, 64) and logits.dtype == jnp.float32
  np.testing.assert_allclose(logits_changed[:, :t], logits[:, :t], rtol=0, atol=1e-5)
  assert float(jnp.abs(logits_changed[:, t:] - logits[:, t:]).max(-1).min()) > 1e-4


def test_bfloat16_compute_keeps_fp32_params_and_logits():
  config = small_config("DS")
  fp32 = LanguageModel(config, rngs=nnx.Rngs(0))
  config.dtype = "bfloat16"
  bf16 = LanguageModel(config, rngs=nnx.Rngs(0))
  assert {x.dtype for x in jax.tree.leaves(nnx.state(bf16, nnx.Param))} == {jnp.dtype(jnp.float32)}
  run = nnx.jit(lambda model, tokens: model(tokens))
  x = tokens(3)
  ref, out = run(fp32, x), run(bf16, x)
  assert out.dtype == jnp.float32
  assert relative_error(out, ref) < 5e-2


def test_count_params_matches_a_manual_count():
  d, vocab, hidden, H, K, V = 32, 64, 128, 2, 16, 8
  Hs, n, N, kd, Vs = 2, 8, 64, 8, 8
  block = 2 * d + 3 * d * hidden  # two norms and the SwiGLU
  gdn2 = (2 * d * H * K + d * H * V  # q, k, v
          + 4 * (2 * H * K + H * V)  # causal convs
          + d * V + V * H * K + H + H * K  # f at rank V, A_log, dt_bias
          + d * H * K + d * H * V  # erase gate b, write gate w
          + V + d * V + V * H * V + H * V + H * V * d)  # o_norm, output gate at rank V with a bias, o_proj
  attention = 4 * d * H * K
  sdm = (2 * d * Hs * 2 * kd + 2 * Hs * n * kd + Hs * N * Vs  # queries, sub-keys, m0
         + d * Hs * Vs + d * Hs + 2 * Hs + d * Hs  # v, decay (a_proj, A_log, dt_bias), b_proj
         + Vs + d * Hs * Vs + Hs * Vs * d)  # o_norm, output gate, o_proj
  expected = 2 * vocab * d + d + 3 * block + gdn2 + attention + sdm
  assert count_params(LanguageModel(small_config("DAM"), rngs=nnx.Rngs(0))) == expected


def test_no_decay_mask_marks_decay_parameters_norm_scales_and_biases():
  params = nnx.state(LanguageModel(small_config("DAM"), rngs=nnx.Rngs(0)), nnx.Param)
  expected = {"final_norm/scale"}
  for i in range(3):
    expected |= {f"blocks/{i}/mixer_norm/scale", f"blocks/{i}/mlp_norm/scale"}
  for i in (0, 2):  # the delta mixer and the SDM
    expected |= {f"blocks/{i}/mixer/decay/A_log", f"blocks/{i}/mixer/decay/dt_bias", f"blocks/{i}/mixer/o_norm/scale"}
  expected.add("blocks/0/mixer/out_gate_proj/layers/1/bias")  # GDN-2's low-rank output gate has a bias
  mask = no_decay_mask(params)
  assert jax.tree.structure(mask) == jax.tree.structure(params)
  assert {name for name, marked in flat(mask).items() if marked} == expected
  pure = no_decay_mask(nnx.to_pure_dict(params))
  assert jax.tree.leaves(pure) == jax.tree.leaves(mask)
  linear = nnx.state(nnx.Linear(2, 3, use_bias=True, rngs=nnx.Rngs(0)), nnx.Param)
  assert {name: bool(m) for name, m in flat(no_decay_mask(linear)).items()} == {"bias": True, "kernel": False}


def test_no_decay_mask_drives_adamw():
  model = LanguageModel(small_config("D"), rngs=nnx.Rngs(0))
  before = flat(nnx.state(model, nnx.Param))
  decay_mask = lambda params: jax.tree.map(lambda no_decay: not no_decay, no_decay_mask(params))
  optimizer = nnx.Optimizer(model, optax.adamw(0.1, weight_decay=0.5, mask=decay_mask), wrt=nnx.Param)
  nnx.jit(lambda optimizer, model: optimizer.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))))(
      optimizer, model)
  after = flat(nnx.state(model, nnx.Param))
  marked = {name for name, m in flat(no_decay_mask(nnx.state(model, nnx.Param))).items() if m}
  for name in before:
    unchanged = bool(jnp.array_equal(before[name], after[name]))
    assert unchanged == (name in marked), name


def test_pattern_is_repeated_or_truncated():
  assert layer_letters("DDDA", 6) == "DDDADD"
  assert layer_letters("SSSM", 2) == "SS"
  with pytest.raises(ValueError, match="pattern"):
    layer_letters("DX", 4)


def test_default_config_has_every_field():
  fields = {"vocab_size", "num_layers", "width", "num_heads", "head_dim", "value_dim", "mixer", "pattern", "impl",
            "chunk_size", "window", "mlp_ratio", "delta", "sdm", "mla", "dtype"}
  config = default_config()
  assert fields <= set(config.keys())
  assert (config.width, config.num_layers, config.num_heads, config.head_dim) == (64, 2, 2, 32)


def test_sdm_options_of_the_config_reach_the_op(monkeypatch):
  """The SDM fields of the model config (the Pallas form's rows, table and table-gradient dtypes) are what the SDM
  layer passes to ops.sparse_delta_rule."""
  from sdm_jax import ops
  seen = []
  op = ops.sparse_delta_rule

  def recording(*args, **kwargs):
    seen.append({k: kwargs.get(k) for k in ("rows_dtype", "rows_segments", "table_dtype", "table_grad_dtype")})
    return op(*args, **{**kwargs, "impl": "chunk", "rows_dtype": "float32", "rows_segments": 1,
                        "table_dtype": "float32", "table_grad_dtype": "float32"})

  monkeypatch.setattr(ops, "sparse_delta_rule", recording)
  config = small_config("SM", sdm=dict(rows_dtype="bfloat16", rows_segments=2, table_dtype="bfloat16",
                                       table_grad_dtype="bfloat16"))
  model = LanguageModel(config, rngs=nnx.Rngs(0))
  assert np.isfinite(float(cross_entropy(model, tokens(0))))
  assert seen == [{"rows_dtype": "bfloat16", "rows_segments": 2, "table_dtype": "bfloat16",
                   "table_grad_dtype": "bfloat16"}]
