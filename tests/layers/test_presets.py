"""The reference presets of the dense layer (DESIGN.md section 4): what each builds, how it starts, and the
model config's nested `delta` that selects and changes one."""

import math

import jax
import numpy as np
import pytest
from flax import nnx

from sdm_jax.layers import PRESETS, DeltaMixer, layer_config
from sdm_jax.models.config import default_config, delta_layer
from sdm_jax.ops import MIXERS

WIDTH, H, K = 256, 2, 64


def build(mixer, preset, **changes):
  V = MIXERS[mixer].value_dim(K, K)
  return DeltaMixer(WIDTH, mixer=mixer, num_heads=H, head_dim=K, value_dim=V,
                    layer=layer_config(mixer, preset, **changes), rngs=nnx.Rngs(0))


def test_default_is_the_papers_own_code_where_public():
  assert layer_config("gdn") == PRESETS["gdn"]["official"]
  assert layer_config("kda") == PRESETS["kda"]["official"]
  assert layer_config("gdn2") == PRESETS["gdn2"]["official"]
  assert layer_config("fg2_gdn") == PRESETS["fg2_gdn"]["fla"] == PRESETS["kda"]["fla"]


def test_the_gates_the_references_build():
  fla, official = (build("gdn2", p) for p in ("fla", "official"))
  assert (fla.layer.output_gate.activation, official.layer.output_gate.activation) == ("sigmoid", "silu")
  for layer in (fla, official):  # width -> V -> H * V with a bias, decay width -> V -> H * K
    assert [l.kernel.shape for l in layer.out_gate_proj.layers] == [(WIDTH, K), (K, H * K)]
    assert layer.out_gate_proj.layers[1].bias is not None
    assert [l.kernel.shape for l in layer.decay.f_proj.layers] == [(WIDTH, K), (K, H * K)]
  kimi = build("kda", "official")
  assert kimi.out_gate_proj.layers[1].bias is None and build("kda", "fla").out_gate_proj.layers[1].bias is not None
  gdn = build("gdn", "official")
  assert gdn.beta_proj.bias is not None and build("gdn", "fla").beta_proj.bias is None
  assert gdn.out_gate_proj.kernel.shape == (WIDTH, H * K) and gdn.decay.f_proj.kernel.shape == (WIDTH, H)


def std_and_bound(x):
  x = np.asarray(x)
  return float(x.std()), float(np.abs(x).max())


def test_each_init_draws_as_its_reference():
  fla = build("kda", "fla")
  std, _ = std_and_bound(fla.q_proj.kernel[...])
  assert abs(std / 0.02 - 1) < 0.05
  std, _ = std_and_bound(fla.q_conv.kernel[...])
  assert abs(std / 0.02 - 1) < 0.1
  np.testing.assert_array_equal(fla.out_gate_proj.layers[1].bias[...], 0)
  xavier = build("gdn2", "official")
  bound = 2**-2.5 * math.sqrt(6 / (WIDTH + H * K))
  std, top = std_and_bound(xavier.q_proj.kernel[...])
  assert top <= bound and abs(std / (bound / math.sqrt(3)) - 1) < 0.05  # uniform on [-bound, bound]
  torch = build("gdn", "official")
  std, top = std_and_bound(torch.q_proj.kernel[...])
  assert top <= WIDTH**-0.5 and abs(std / (WIDTH**-0.5 / math.sqrt(3)) - 1) < 0.05
  std, top = std_and_bound(torch.q_conv.kernel[...])  # PyTorch's depthwise Conv1d: U(+-1/sqrt(4))
  assert top <= 0.5 and abs(std / (0.5 / math.sqrt(3)) - 1) < 0.1


@pytest.mark.parametrize("mixer", list(MIXERS))
def test_every_preset_of_every_mixer_builds_and_runs(mixer):
  for preset in PRESETS.get(mixer, {"fla": None}):
    layer = build(mixer, preset)
    y = layer(jax.random.normal(jax.random.key(0), (1, 8, WIDTH)))
    assert y.shape == (1, 8, WIDTH) and bool(np.isfinite(np.asarray(y)).all())


def test_bad_layer_configs_are_named():
  with pytest.raises(ValueError, match=r"preset: kda has presets \('default', 'fla', 'official'\), got 'mine'"):
    layer_config("kda", "mine")
  with pytest.raises(ValueError, match=r"unknown fields \['gate_rank'\]"):
    layer_config("kda", gate_rank=3)
  with pytest.raises(ValueError, match="output_gate.activation: expected one of"):
    layer_config("kda", output_gate={"activation": "tanh"})
  with pytest.raises(ValueError, match="decay_rank: expected 'full', 'value'"):
    layer_config("kda", decay_rank=0)
  with pytest.raises(ValueError, match="linear_init: expected one of"):
    layer_config("kda", linear_init="orthogonal")
  with pytest.raises(ValueError, match="mixer: expected one of"):
    layer_config("mamba")


def test_the_model_config_selects_and_changes_a_preset():
  c = default_config()
  c.mixer = "gdn2"
  assert delta_layer(c) == PRESETS["gdn2"]["official"]
  c.delta.preset = "fla"
  c.delta.output_gate.activation, c.delta.output_gate.rank, c.delta.decay_rank = "silu", "16", "full"
  layer = delta_layer(c)
  assert layer.output_gate.activation == "silu" and layer.output_gate.rank == 16 and layer.decay_rank == "full"
  assert layer.output_gate.bias and layer.linear_init == "normal"  # the rest is fla's


def test_fla_preset_in_a_model_takes_the_models_norm_eps_as_fla_models_do():
  c = default_config()
  c.mixer, c.delta.preset, c.norm_eps = "kda", "fla", 1e-6
  assert delta_layer(c).norm_eps == 1e-6
  c.delta.norm_eps = 1e-5  # set: kept
  assert delta_layer(c).norm_eps == 1e-5
  c.delta.norm_eps, c.delta.preset = None, "official"  # the paper's code: its own layer's eps
  assert delta_layer(c).norm_eps == PRESETS["kda"]["official"].norm_eps
