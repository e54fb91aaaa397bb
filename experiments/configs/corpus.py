r"""Language modelling on a pre-tokenized corpus with packed documents, one variant per mixer and hybrid (the
variants of experiments/configs/text.py).

  python -m experiments.prepare_data --out=data/stdlib          # the offline default: the stdlib and its docs
  python -m experiments.train --config=experiments/configs/corpus.py:gdn2 --workdir=runs/corpus_gdn2

The argument is "VARIANT" or "VARIANT,DATA_DIR" (default data/stdlib, what prepare_data's defaults write); every
variant is sized for a GPU but "cpu", a 1-layer width-64 GDN-2 trained 20 steps of 4 rows of 128 tokens (the
README's command on a laptop CPU, in about a minute; a check that it runs, not a result). The
vocabulary is read from DATA_DIR's manifest when it exists, else the default tokenizer's 4096; a corpus needing more
is refused with a message when the data is opened. Packing: --config.data.packing=concat_then_split (default
first_fit).
"""

import json
import pathlib

import ml_collections

from experiments.configs.common import model_config, train_config
from sdm_jax.data import default_data_config
from sdm_jax.data import shards


def _vocab_size(data_dir, default):
  path = pathlib.Path(data_dir) / shards.MANIFEST
  if not path.is_file():
    return default
  return json.loads(path.read_text())["tokenizer"]["vocab_size"]


def get_config(argument="gdn2"):
  variant, _, data_dir = argument.partition(",")
  config = ml_collections.ConfigDict()
  config.seed = 0
  data = default_data_config("corpus")
  if data_dir:
    data.data_dir = data_dir
  data.vocab_size = _vocab_size(data.data_dir, data.vocab_size)
  config.data = data
  if variant == "cpu":
    data.seq_len, data.batch_size = 128, 4
    config.model = model_config("gdn2", data.vocab_size, num_layers=1, width=64, num_heads=2, head_dim=32)
    config.train = train_config(20, 3e-3, warmup_steps=5, log_every=5, eval_every=20, checkpoint_every=10)
    config.train.eval_batches = 2
    return config
  data.seq_len, data.batch_size = 1024, 16
  config.model = model_config(variant, data.vocab_size, num_layers=4, width=256, num_heads=4, head_dim=64)
  config.train = train_config(5000, 1e-3, warmup_steps=200, log_every=50, eval_every=500, checkpoint_every=500)
  return config
