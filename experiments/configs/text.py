r"""Byte-level language modelling on the CPython standard library's sources, one variant per mixer
and hybrid (the variants of experiments/configs/mqar.py).

  python -m experiments.train --config=experiments/configs/text.py:gdn2 --workdir=runs/text_gdn2
"""

import ml_collections

from experiments.configs.common import model_config, train_config
from sdm_jax.data import default_data_config


def get_config(variant="gdn2"):
  config = ml_collections.ConfigDict()
  config.seed = 0
  data = default_data_config("text")
  data.seq_len, data.batch_size = 512, 16
  config.data = data
  config.model = model_config(variant, data.vocab_size, num_layers=4, width=256, num_heads=4, head_dim=64)
  config.train = train_config(5000, 1e-3, warmup_steps=200, log_every=50, eval_every=500, checkpoint_every=500)
  return config
