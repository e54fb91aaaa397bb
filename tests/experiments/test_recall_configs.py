"""The recall study's configs: every variant name parses, and the models are matched as the file says (block
parameters within 5 % of the GDN model's; the hybrids' training FLOPs per token within 5 % of them); the protocol's
settings are ones the data and the claims can use."""

import dataclasses

import pytest

from experiments.configs import recall
from sdm_jax.data import mqar
from sdm_jax.models import costs
from sdm_jax.training.config import check_config


def test_variant_names():
  assert recall.parse_variant("mqar_gdn") == ("mqar", "gdn", 128, None)
  assert recall.parse_variant("mk_niah_3_fg2_gdn_plus_w64") == ("mk_niah_3", "fg2_gdn_plus", 64, None)
  assert recall.parse_variant("s_niah_1_swa_w256") == ("s_niah_1", "swa", 256, None)
  assert recall.parse_variant("s_niah_1_swa_gdn_w64_lr1e-2") == ("s_niah_1", "swa_gdn", 64, 0.01)
  assert recall.parse_variant("mqar_gdn2_lr0.003") == ("mqar", "gdn2", 128, 0.003)
  for rate in recall.LEARNING_RATES:
    name = recall.variant_name("mqar", "kda", 256, rate)
    assert recall.parse_variant(name) == ("mqar", "kda", 256, rate)
    assert recall.get_config(name).train.learning_rate == rate
  assert recall.get_config("mqar_kda").train.learning_rate == 3e-3
  for bad, close in (("mqar_gdm", "mqar_gdn"), ("mqar_gdn_w100", None), ("niah_gdn", None), ("mqar_gdn_lr0", None),
                     ("mqar_gdn_lrx", None)):
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


def test_the_sdm_hybrid_and_its_control_have_one_shape():
  for task, patterns in (("mqar", ("SM", "SD")), ("mk_niah_1", ("SSSM", "SSSD"))):
    sdm, control = recall.get_config(f"{task}_sdm_w128"), recall.get_config(f"{task}_swa_gdn_w128")
    assert (sdm.model.pattern, control.model.pattern) == patterns and control.model.mixer == recall.REFERENCE
    # SDM writes and reads as many slots a token as the dense GDN state has key channels.
    assert sdm.model.sdm.topk_write == sdm.model.sdm.topk_read == sdm.model.head_dim == recall.HEAD_DIM == 64


def test_protocol_settings():
  assert len(recall.LEARNING_RATES) >= 3 and recall.SEEDS >= 5 and recall.SUCCESS <= recall.STOP_AT_ACCURACY
  pairs = [pairs for _, pairs in recall.PRESSURE_POINTS]
  assert min(pairs) <= recall.HEAD_DIM / 4 and max(pairs) >= 4 * recall.HEAD_DIM and len(recall.PRESSURE_WIDTHS) >= 2
  assert recall.PILOT_POINT in recall.PRESSURE_POINTS and recall.PILOT_WIDTH in recall.PRESSURE_WIDTHS
  config = recall.get_config("mqar_gdn_w64")
  assert config.train.stop_at_accuracy == recall.STOP_AT_ACCURACY
  assert recall.get_config("s_niah_1_gdn_w64").train.stop_at_accuracy == recall.STOP_AT_ACCURACY
  for seq_len, pairs in recall.PRESSURE_POINTS:  # trained on the halvings down to 4 pairs, evaluated at the pairs
    assert seq_len == max(128, 4 * pairs)
    task = mqar.MQARConfig(vocab_size=recall.MQAR_VOCAB, seq_len=seq_len, num_kv_pairs=pairs, num_queries=pairs,
                           min_kv_pairs=config.data.min_kv_pairs)
    assert max(mqar.kv_pairs_choices(task)) == pairs and min(mqar.kv_pairs_choices(task)) == 4
    evaluated = mqar.make_example(dataclasses.replace(task, min_kv_pairs=0), "validation", 0)
    assert evaluated["mask"].sum() == pairs
  check_config(recall.get_config("mqar_sdm_w64"))
  for _, comparisons, tasks in recall.CLAIMS:
    assert {m for pair in comparisons for m in pair} <= set(recall.STUDY_MIXERS) and set(tasks) <= set(recall.TASKS)


@pytest.mark.parametrize("task, mixers", [("mqar", recall.STUDY_MIXERS), ("s_niah_1", ("kda", "swa", "sdm",
                                                                                         "swa_gdn"))])
def test_models_are_matched(task, mixers):
  reference = recall.get_config(f"{task}_gdn_w64")
  counts = costs.param_counts(reference.model)
  flops = costs.flops_per_token(reference.model, reference.data.seq_len)
  for mixer in mixers:
    config = recall.get_config(f"{task}_{mixer}_w64")
    if mixer in recall.HYBRID_LAST_LAYER:
      assert costs.flops_per_token(config.model, config.data.seq_len) == pytest.approx(flops, rel=0.05), mixer
      assert costs.param_counts(config.model)["tables"] == (4096 * 64 if mixer == "sdm" else 0)  # 1 head of 4096 x 64
    else:
      assert costs.param_counts(config.model)["blocks"] == pytest.approx(counts["blocks"], rel=0.05), mixer
