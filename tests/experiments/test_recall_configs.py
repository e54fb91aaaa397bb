"""The recall study's configs: every variant name parses, and the models are matched as the file says (block
parameters within 5 % of the GDN model's; the SDM hybrid's training FLOPs per token within 5 % of them)."""

import pytest

from experiments.configs import recall
from sdm_jax.models import costs


def test_variant_names():
  assert recall.parse_variant("mqar_gdn") == ("mqar", "gdn", 128)
  assert recall.parse_variant("mk_niah_3_fg2_gdn_plus_w64") == ("mk_niah_3", "fg2_gdn_plus", 64)
  assert recall.parse_variant("s_niah_1_swa_w256") == ("s_niah_1", "swa", 256)
  for bad, close in (("mqar_gdm", "mqar_gdn"), ("mqar_gdn_w100", None), ("niah_gdn", None)):
    with pytest.raises(ValueError, match="config variant") as error:
      recall.get_config(bad)
    assert close is None or repr(close) in str(error.value)


def test_patterns_and_data():
  config = recall.get_config("mqar_sdm_w64")
  assert (config.model.pattern, config.model.num_layers, config.model.width, config.model.num_heads) == ("SM", 2, 64, 1)
  assert config.data.vocab_size == config.model.vocab_size == 8192 and config.data.min_kv_pairs == 4
  niah = recall.get_config("mk_niah_2_sdm_w64")
  assert (niah.model.pattern, niah.model.num_layers, niah.data.haystack) == ("SSSM", 4, "needles")
  assert recall.get_config("s_niah_3_attention_w64").data.value_type == "uuids"


@pytest.mark.parametrize("task, mixers", [("mqar", recall.STUDY_MIXERS), ("s_niah_1", ("kda", "swa", "sdm"))])
def test_models_are_matched(task, mixers):
  reference = recall.get_config(f"{task}_gdn_w64")
  counts = costs.param_counts(reference.model)
  flops = costs.flops_per_token(reference.model, reference.data.seq_len)
  for mixer in mixers:
    config = recall.get_config(f"{task}_{mixer}_w64")
    if mixer == "sdm":
      assert costs.flops_per_token(config.model, config.data.seq_len) == pytest.approx(flops, rel=0.05), mixer
      assert costs.param_counts(config.model)["tables"] == 4096 * 64  # one head of 4096 slots x 64
    else:
      assert costs.param_counts(config.model)["blocks"] == pytest.approx(counts["blocks"], rel=0.05), mixer
