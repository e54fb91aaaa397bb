r"""RULER-style needle-in-a-haystack over bytes (multi-key: 4 needles, 2 asked), one variant per
mixer and hybrid (the variants of experiments/configs/mqar.py). Eval reports sequence exact match.

  python -m experiments.train --config=experiments/configs/niah.py:sdm --workdir=runs/niah_sdm
"""

import ml_collections

from experiments.configs.common import model_config, train_config
from sdm_jax.data import default_data_config


def get_config(variant="gdn2"):
  config = ml_collections.ConfigDict()
  config.seed = 0
  data = default_data_config("niah")
  data.seq_len, data.batch_size = 1024, 8
  data.num_needles, data.num_queries = 4, 2
  config.data = data
  config.model = model_config(variant, data.vocab_size, num_layers=4, width=256, num_heads=4, head_dim=64)
  config.train = train_config(3000, 1e-3, warmup_steps=200, log_every=50, eval_every=500, checkpoint_every=500)
  return config
