r"""MQAR (multi-query associative recall) configs, one variant per mixer and hybrid.

  python -m experiments.train --config=experiments/configs/mqar.py:gdn2 --workdir=runs/mqar_gdn2

Variants: gdn, kda, fg2_gdn, fg2_gdn_plus, gdn2 (pattern "D"), gdn2_swa ("DS"), fg2_attn
("DDDA"), sdm ("SSSM"), all sized for a GPU; demo (a tiny GDN-2 that learns in 300 steps, for `make demo`) and cpu
(the demo's task and one of its two layers, 20 steps of 8 sequences: the README's commands on a laptop CPU, in well under a
minute each; too few steps to learn). Override any field from the command line, e.g. --config.train.steps=500 or
--config.model.mixer=kda.
"""

import ml_collections

from experiments.configs.common import VARIANTS, check_variant, model_config, train_config
from sdm_jax.data import default_data_config


def get_config(variant="gdn2"):
  check_variant(variant, (*VARIANTS, "demo", "cpu"))
  config = ml_collections.ConfigDict()
  config.seed = 0
  data = default_data_config("mqar")
  if variant in ("demo", "cpu"):
    # Small enough to learn visibly on a CPU in about two minutes (chance accuracy 1/32).
    data.seq_len, data.batch_size, data.vocab_size = 32, 32, 64
    data.num_kv_pairs = data.num_queries = 4
    config.model = model_config("gdn2", data.vocab_size, width=64, head_dim=32)
    config.train = train_config(300, 1e-2, warmup_steps=10, log_every=10, eval_every=150, checkpoint_every=50)
    if variant == "cpu":  # every command of the README in seconds: a check that it runs, not a result
      data.batch_size, config.model.num_layers = 8, 1
      config.train = train_config(20, 1e-2, warmup_steps=5, log_every=5, eval_every=20, checkpoint_every=10)
      config.train.eval_batches = 2
  else:
    # Zoology's MQAR (vocab 8192, 16 pairs in 128 tokens). The head is tied to the embedding, as in Zoology's
    # models: untied, a recalled value's logit needs its own head row, which only that value's targets train, and
    # every mixer stays at chance (loss ln 4096) for 1,000 steps on the H200 (benchmarks/mqar/2026-11-29_h200_mqar/).
    # Tied, at batch 128, GDN-2 learns it on the H200 to an eval accuracy of 0.9995 at lr 3e-3 (1e-2 leaves the
    # plateau later; benchmarks/recall/README.md and its older sections).
    data.seq_len, data.batch_size = 128, 128
    data.num_kv_pairs = data.num_queries = 16
    config.model = model_config(variant, data.vocab_size)
    config.model.tie_embeddings = True
    config.train = train_config(3000, 3e-3, warmup_steps=100, log_every=50, eval_every=500, checkpoint_every=500)
  config.data = data
  return config
