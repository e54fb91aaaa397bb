"""fla checkpoints both ways: our layers and models hold fla 0.6.0's own outputs (golden files that
tests/interop/make_fla_goldens.py made with fla on a GPU), save_fla then load_fla is bit-exact, and every bad
tensor, file or config field is a ValueError naming it. No torch here."""

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from sdm_jax.interop import fla_config, fla_layer, load_fla, save_fla
from sdm_jax.interop.fla import _flat_state, _model_config, _model_path
from sdm_jax.models.config import default_config
from sdm_jax.models.lm import LanguageModel
from sdm_jax.testing.errors import relative_error

GOLDEN = pathlib.Path(__file__).parent / "golden"
LAYER_SHAPE = dict(hidden_size=64, num_heads=2, head_dim=32)  # make_fla_goldens.LAYER_SHAPE
MODEL_TYPES = {"gdn": "gated_deltanet", "kda": "kda"}


@pytest.mark.parametrize("kind", ["gdn", "kda", "gdn2"])
def test_a_layer_loaded_from_fla_gives_fla_s_output(kind):
  io = load_file(GOLDEN / f"layer_{kind}_io.safetensors")
  layer = fla_layer(kind, GOLDEN / f"layer_{kind}.safetensors", **LAYER_SHAPE, impl="chunk")
  y = nnx.jit(lambda layer, x: layer(x))(layer, jnp.asarray(io["x"]))
  assert y.shape == io["y"].shape
  assert relative_error(y, io["y"]) <= 1e-4


@pytest.mark.parametrize("impl", ["chunk", "pallas"])
def test_kda_s_safe_gate_layer_loaded_from_fla_gives_fla_s_output(impl):
  # fla's KimiDeltaAttention(safe_gate=True, lower_bound=-5): its gate lower_bound * sigmoid(...), and the op told
  # the bound (pallas then forms its grams in the bounded way).
  io = load_file(GOLDEN / "layer_kda_safe_gate_io.safetensors")
  layer = fla_layer("kda", GOLDEN / "layer_kda_safe_gate.safetensors", **LAYER_SHAPE, lower_bound=-5.0, impl=impl)
  y = nnx.jit(lambda layer, x: layer(x))(layer, jnp.asarray(io["x"]))
  assert relative_error(y, io["y"]) <= 1e-4
  plain = fla_layer("kda", GOLDEN / "layer_kda_safe_gate.safetensors", **LAYER_SHAPE, impl=impl)
  assert relative_error(nnx.jit(lambda layer, x: layer(x))(plain, jnp.asarray(io["x"])), io["y"]) > 1e-2


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_a_model_loaded_from_fla_gives_fla_s_logits(kind):
  io = load_file(GOLDEN / f"model_{kind}_io.safetensors")
  model, config = load_fla(GOLDEN / f"model_{kind}")
  assert config.tie_embeddings == (kind == "gdn")  # the goldens have one tied and one own head
  logits = nnx.jit(lambda model, tokens: model(tokens))(model, jnp.asarray(io["tokens"]))
  assert logits.dtype == jnp.float32 and logits.shape == io["logits"].shape
  assert relative_error(logits, io["logits"]) <= 1e-4


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_save_fla_then_load_fla_is_bit_exact(kind, tmp_path):
  model, config = load_fla(GOLDEN / f"model_{kind}")
  save_fla(model, config, tmp_path / "out")
  again, config_again = load_fla(tmp_path / "out")
  assert config_again.to_dict() == config.to_dict()
  ours, theirs = (nnx.to_pure_dict(nnx.state(m, nnx.Param)) for m in (model, again))
  assert jax.tree.structure(ours) == jax.tree.structure(theirs)
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
    np.testing.assert_array_equal(a, b)
  # The written tensors are fla's own names and layouts, byte for byte.
  original, written = load_file(GOLDEN / f"model_{kind}" / "model.safetensors"), load_file(tmp_path / "out" /
                                                                                           "model.safetensors")
  original.pop("lm_head.weight", None) if config.tie_embeddings else None
  assert set(written) == set(original)
  for name in original:
    np.testing.assert_array_equal(written[name], original[name].astype(np.float32))


def test_the_fla_init_preset_matches_fla_s_fresh_model():
  """Our model at fla's config with init "fla" and the fla layer preset draws every tensor as fla's model does."""
  for kind in MODEL_TYPES:
    golden = json.loads((GOLDEN / f"init_{kind}.json").read_text())
    config = _model_config(dict(golden["shape"], model_type=MODEL_TYPES[kind]), "test")
    ours = _flat_state(LanguageModel(config, rngs=nnx.Rngs(0)))
    for name, stats in golden["tensors"].items():
      if name == "lm_head.weight" and config.tie_embeddings:
        continue
      path, _ = _model_path(config.mixer, name)
      x = np.asarray(ours[path])
      assert x.size == stats["numel"], name
      if stats["numel"] < 1000:  # A_log, dt_bias, norms: their ranges are tested with the layer
        continue
      # Two samples of n draws: their means differ by ~ sqrt(2 / n) std, their stds by ~ 1 / sqrt(n) relative.
      assert abs(x.mean() - stats["mean"]) <= 5 * stats["std"] * np.sqrt(2 / x.size), name
      assert abs(x.std() / stats["std"] - 1) <= 5 / np.sqrt(x.size), (name, x.std(), stats["std"])


@pytest.fixture
def checkpoint(tmp_path):
  path = tmp_path / "kda"
  shutil.copytree(GOLDEN / "model_kda", path)
  return path


def _edit_tensors(path, edit):
  tensors = load_file(path / "model.safetensors")
  edit(tensors)
  save_file(tensors, path / "model.safetensors")


def _edit_config(path, **fields):
  config = json.loads((path / "config.json").read_text())
  config.update(fields)
  (path / "config.json").write_text(json.dumps(config))


def test_an_unknown_tensor_is_named(checkpoint):
  _edit_tensors(checkpoint, lambda t: t.update({"model.layers.0.attn.z_proj.weight": np.zeros((2, 2), np.float32)}))
  with pytest.raises(ValueError, match=r"unknown tensor 'model.layers.0.attn.z_proj.weight'"):
    load_fla(checkpoint)


def test_a_missing_tensor_is_named(checkpoint):
  _edit_tensors(checkpoint, lambda t: t.pop("model.layers.1.attn.g_proj.1.bias"))
  with pytest.raises(ValueError, match=r"missing tensors for \['blocks/1/mixer/out_gate_proj/layers/1/bias'\]"):
    load_fla(checkpoint)


def test_a_misshaped_tensor_is_named(checkpoint):
  _edit_tensors(checkpoint, lambda t: t.update({"model.layers.0.attn.q_proj.weight": np.zeros((64, 32), np.float32)}))
  with pytest.raises(ValueError, match=r"tensor 'model.layers.0.attn.q_proj.weight': expected shape \(64, 64\) for "
                                       r"this config, got \(64, 32\)"):
    load_fla(checkpoint)


@pytest.mark.parametrize("field, value", [("allow_neg_eigval", True), ("num_v_heads", 4), ("safe_gate", True),
                                          ("model_type", "mamba2"), ("hidden_act", "powlu")])
def test_an_unsupported_config_field_is_named(checkpoint, field, value):
  _edit_config(checkpoint, **{field: value})
  with pytest.raises(ValueError, match=field):
    load_fla(checkpoint)


def test_bad_files_are_named(checkpoint, tmp_path):
  with pytest.raises(ValueError, match="expected a directory with config.json"):
    load_fla(tmp_path / "nothing")
  (checkpoint / "model.safetensors").write_bytes(b"\x00" * 100)
  with pytest.raises(ValueError, match="not a readable safetensors file"):
    load_fla(checkpoint)
  (checkpoint / "config.json").write_text("{")
  with pytest.raises(ValueError, match="config.json is not JSON"):
    load_fla(checkpoint)
  with pytest.raises(ValueError, match="kind: expected one of"):
    fla_layer("mamba", {}, **LAYER_SHAPE)


def test_save_fla_refuses_what_fla_s_models_cannot_express(tmp_path):
  config = default_config()
  config.mixer, config.delta.preset = "kda", "official"  # Kimi Linear's gate has no bias; fla's has one
  model = LanguageModel(config, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"differs from fla's in \['output_gate'"):
    save_fla(model, config, tmp_path / "out")
  config.delta.preset, config.pattern = "fla", "DA"
  with pytest.raises(ValueError, match="pattern 'D'"):
    fla_config(config)
  config.pattern, config.mixer = "D", "gdn2"
  with pytest.raises(ValueError, match="fla's models are"):
    fla_config(config)


def test_kda_s_safe_gate_loads_into_the_bound_and_saves_back(checkpoint, tmp_path):
  """fla's KDAConfig(safe_gate=True, lower_bound=-5): the layers' lower_bound (their gate the bounded one), written
  back as fla's safe gate; with safe_gate False fla's gate is bounded all the same, and reads the same."""
  tokens = jnp.asarray(load_file(GOLDEN / "model_kda_io.safetensors")["tokens"])
  plain, _ = load_fla(checkpoint)
  for safe_gate, bound in ((True, -5.0), (False, -3)):
    _edit_config(checkpoint, safe_gate=safe_gate, lower_bound=bound)
    model, config = load_fla(checkpoint)
    assert config.delta.lower_bound == bound and model.blocks[1].mixer.decay.lower_bound == bound
    assert relative_error(model(tokens), plain(tokens)) > 1e-3  # the bounded gate, not the softplus one
    save_fla(model, config, tmp_path / str(bound))
    written = json.loads((tmp_path / str(bound) / "config.json").read_text())
    assert (written["safe_gate"], written["lower_bound"]) == (True, bound)  # fla's kernels take both bounds
    again, config_again = load_fla(tmp_path / str(bound))
    assert config_again.to_dict() == config.to_dict()
    for a, b in zip(*(jax.tree.leaves(nnx.state(m, nnx.Param)) for m in (model, again))):
      np.testing.assert_array_equal(a, b)
  config.chunk_size, config.delta.lower_bound = 16, -8.0  # ours at chunk 16 takes it; fla's safe_gate kernels do not
  assert (fla_config(config)["safe_gate"], fla_config(config)["lower_bound"]) == (False, -8.0)
  layer = fla_layer("kda", GOLDEN / "layer_kda.safetensors", **LAYER_SHAPE, lower_bound=-5.0)
  assert layer.decay.lower_bound == -5.0


def test_bounds_fla_or_we_cannot_build_are_named(checkpoint, tmp_path):
  for fields, message in (({"safe_gate": True, "lower_bound": None}, r"config field safe_gate=True is not supported"),
                          ({"lower_bound": "-5"}, r"config field lower_bound='-5' is not supported \(expected a num"),
                          ({"safe_gate": True, "lower_bound": -8.0},
                           r"kda layer's lower_bound: expected None or a number in \[-5, 0\) at chunk size 32")):
    _edit_config(checkpoint, **fields)
    with pytest.raises(ValueError, match=message):
      load_fla(checkpoint)
  gdn = tmp_path / "gdn"
  shutil.copytree(GOLDEN / "model_gdn", gdn)
  _edit_config(gdn, lower_bound=-5.0)
  with pytest.raises(ValueError, match=r"lower_bound=-5.0 is not supported \(fla's gated_deltanet layer has no"):
    load_fla(gdn)
  for kind in ("gdn", "gdn2"):
    with pytest.raises(ValueError, match=rf"^lower_bound: fla's {kind} layer has no bounded gate"):
      fla_layer(kind, GOLDEN / f"layer_{kind}.safetensors", **LAYER_SHAPE, lower_bound=-5.0)
  config = default_config()
  config.mixer, config.delta.preset, config.delta.lower_bound = "gdn", "fla", -5.0
  with pytest.raises(ValueError, match=r"differs from fla's in \['lower_bound'\]"):
    fla_config(config)
