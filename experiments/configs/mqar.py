r"""MQAR (multi-query associative recall) configs, one variant per mixer and hybrid.

  python -m experiments.train --config=experiments/configs/mqar.py:gdn2 --workdir=runs/mqar_gdn2

Variants: gdn, kda, fg2_gdn, fg2_gdn_plus, gdn2 (pattern "D"), gdn2_swa ("DS"), fg2_attn
("DDDA"), sdm ("SSSM"), and demo (a tiny GDN-2 for `make demo`). Override any field from the
command line, e.g. --config.train.steps=500.
"""

import ml_collections

from experiments.configs.common import VARIANTS, check_variant, model_config, train_config
from sdm_jax.data import default_data_config


def get_config(variant="gdn2"):
  check_variant(variant, (*VARIANTS, "demo"))
  config = ml_collections.ConfigDict()
  config.seed = 0
  data = default_data_config("mqar")
  if variant == "demo":
    # Small enough to learn visibly on a CPU in about two minutes (chance accuracy 1/32).
    data.seq_len, data.batch_size, data.vocab_size = 32, 32, 64
    data.num_kv_pairs = data.num_queries = 4
    config.model = model_config("gdn2", data.vocab_size, width=64, head_dim=32)
    config.train = train_config(300, 1e-2, warmup_steps=10, log_every=10, eval_every=150, checkpoint_every=50)
  else:
    data.seq_len, data.batch_size = 128, 32
    data.num_kv_pairs = data.num_queries = 16
    config.model = model_config(variant, data.vocab_size)
    config.train = train_config(2000, 3e-3)
  config.data = data
  return config
