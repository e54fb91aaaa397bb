"""What the fla peer of the whole-model benchmark builds, checked without torch."""

import pathlib
import subprocess
import sys

import pytest

from sdm_jax.benchmarking import peer_train

SHAPE = dict(num_layers=8, width=2048, num_heads=16, head_dim=128, mlp_hidden=5632, vocab_size=32000)
COMMON = dict(hidden_size=2048, num_hidden_layers=8, num_heads=16, intermediate_size=5632, vocab_size=32000,
              tie_word_embeddings=False, fuse_norm=True, fuse_swiglu=True, fuse_cross_entropy=True)


@pytest.mark.parametrize("model, config_class", [("kda", "KDAConfig"), ("gdn", "GatedDeltaNetConfig")])
def test_delta_rule_peers_get_the_shape_with_values_as_wide_as_keys(model, config_class):
  name, kwargs = peer_train.peer_kwargs(model, **SHAPE)
  assert name == config_class
  assert kwargs == dict(COMMON, head_dim=128, expand_v=1.0)


def test_the_safe_gate_peer_is_kda_with_fla_s_bounded_decay_at_the_op_benchmark_s_bound():
  from sdm_jax.benchmarking.fla_peer import PEER_MODES
  name, kwargs = peer_train.peer_kwargs("kda_safe_gate", **SHAPE)
  assert name == "KDAConfig" and peer_train.MODELS["kda_safe_gate"][1] == "KDAForCausalLM"
  assert kwargs == dict(COMMON, head_dim=128, expand_v=1.0, **PEER_MODES["safe_gate"])


def test_attention_peer_takes_head_dim_from_width():
  name, kwargs = peer_train.peer_kwargs("attention", **SHAPE)
  assert name == "TransformerConfig"
  assert kwargs == COMMON
  with pytest.raises(ValueError, match="head_dim must be 128, got 64"):
    peer_train.peer_kwargs("attention", **dict(SHAPE, head_dim=64))


def test_unknown_model_is_refused():
  with pytest.raises(ValueError, match="model: expected one of .*'mamba'"):
    peer_train.peer_kwargs("mamba", **SHAPE)


def test_run_writes_the_error_for_an_unknown_model(tmp_path):
  out = tmp_path / "result.json"
  result = peer_train.run("mamba", batch=1, seq_len=8, steps=1, warmup=0, out=str(out), **SHAPE)
  assert result["stage"] == "import" and result["error"].startswith("ValueError during 'import'")
  assert out.exists()


def test_import_loads_neither_torch_nor_jax():
  code = "import sys, sdm_jax.benchmarking.peer_train; print(sorted({'torch', 'jax'} & set(sys.modules)))"
  loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=pathlib.Path(__file__).resolve().parents[2]).stdout
  assert loaded.strip() == "[]"
