"""The paper-size configs (experiments/configs/paper.py): every variant builds with fla's shapes, and the dense
mixers' parameter counts, taken from jax.eval_shape (no arrays, no compile), lie within 15 % of the size named."""

import pytest
from flax import nnx

from experiments.configs import paper
from experiments.configs.common import MIXERS, VARIANTS
from sdm_jax import ops
from sdm_jax.models import LanguageModel, count_params, layer_letters

# fla's GatedMLP hidden for hidden_ratio 4: 2/3 * 4 * width rounded up to a multiple of 256 (fla/modules/mlp.py).
SWIGLU = {1024: 2816, 2048: 5632}
SHAPES = {"340m": (24, 1024, 8), "1.3b": (24, 2048, 16), "ref": (8, 2048, 16)}  # layers, width, heads of 128
NOMINAL = {"340m": 340e6, "1.3b": 1.3e9}


def test_every_variant_builds():
  assert set(paper.NAMES) == {f"{name}_{size}" for name in VARIANTS for size in SHAPES}
  for variant in paper.NAMES:
    config = paper.get_config(variant)
    model, size = config.model, variant.rpartition("_")[2]
    assert (model.num_layers, model.width, model.num_heads) == SHAPES[size], variant
    assert model.head_dim == model.value_dim == 128
    assert round(model.mlp_ratio * model.width) == SWIGLU[model.width]
    assert (model.vocab_size, model.dtype, model.impl, model.sdm.impl) == (32000, "bfloat16", "auto", "auto")
    assert config.data.name == "corpus" and config.data.vocab_size == model.vocab_size
    assert config.data.seq_len == 4096
    assert len(layer_letters(model.pattern, model.num_layers)) == model.num_layers
  assert paper.get_config("sdm_ref").data.batch_size == 4  # DESIGN.md section 7: B x T = 4 x 4096
  assert paper.get_config("sdm_ref").train.gradient_accumulation_steps == 1
  for variant in ("kda_340m", "gdn2_swa_1.3b"):  # flame's 0.5M tokens a step, in microbatches of 4 x 4096
    config = paper.get_config(variant)
    assert (config.data.batch_size, config.train.gradient_accumulation_steps) == (128, 32), variant
  assert paper.get_config("gdn2_340m,/tmp/corpus").data.data_dir == "/tmp/corpus"
  for bad in ("kda_7b", "mamba_340m", "kda"):
    with pytest.raises(ValueError, match="variant"):
      paper.get_config(bad)


@pytest.mark.parametrize("variant", [f"{mixer}_{size}" for size in NOMINAL for mixer in MIXERS])
def test_dense_mixer_parameter_count_is_the_named_size(variant):
  config = paper.get_config(variant)
  c = config.model
  model = nnx.eval_shape(lambda: LanguageModel(c, rngs=nnx.Rngs(0)))
  assert model.blocks[0].mlp.gate_proj.kernel.shape == (c.width, SWIGLU[c.width])
  # fla's size names count the embedding as if tied to the head: flame's 24 x 1024 DeltaNet comes to ~341M so.
  named = count_params(model) - c.vocab_size * c.width
  # Those names budget no channel-wise gate: FG2-GDN's beta, FG2-GDN+'s beta_k and beta_v, GDN-2's b and w
  # are each a full width -> H * 128 projection here, 16-25 % of the named size in all.
  channel_gates = sum(shape != "head" for _, shape in ops.MIXERS[c.mixer].gates)
  named -= c.num_layers * channel_gates * c.width * c.num_heads * c.head_dim
  assert abs(named / NOMINAL[variant.rpartition("_")[2]] - 1) <= 0.15, f"{variant}: {named:,}"
