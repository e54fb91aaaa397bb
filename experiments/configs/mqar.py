r"""MQAR (multi-query associative recall) configs, one variant per mixer and hybrid.

  python -m experiments.train --config=experiments/configs/mqar.py:gdn2 --workdir=runs/mqar_gdn2

Variants: gdn, kda, fg2_gdn, fg2_gdn_plus, gdn2 (pattern "DD"), gdn2_swa ("DS", GDN-2 alternating
with sliding-window attention), fg2_attn ("DDDA", FG2-GDN 3 : 1 full attention), sdm ("SSSM",
3 sliding-window attention : 1 Sparse Delta Memory), demo (a tiny GDN-2 for `make demo`).
Any field can be overridden from the command line, e.g. --config.train.steps=500.
"""

import ml_collections

from sdm_jax.data import default_data_config
from sdm_jax.models.config import default_config as default_model_config

HYBRIDS = {
    "gdn2_swa": ("gdn2", "DS", 2),
    "fg2_attn": ("fg2_gdn", "DDDA", 4),
    "sdm": ("gdn2", "SSSM", 4),
}
MIXERS = ("gdn", "kda", "fg2_gdn", "fg2_gdn_plus", "gdn2")


def get_config(variant="gdn2"):
  config = ml_collections.ConfigDict()
  config.seed = 0

  data = default_data_config("mqar")
  data.seq_len, data.batch_size = 128, 32
  data.num_kv_pairs = data.num_queries = 16
  config.data = data

  model = default_model_config()
  model.num_layers, model.width, model.num_heads, model.head_dim = 2, 128, 2, 64
  model.value_dim = 64
  model.impl = "chunk"
  if variant in MIXERS:
    model.mixer, model.pattern = variant, "D"
  elif variant in HYBRIDS:
    model.mixer, model.pattern, model.num_layers = HYBRIDS[variant]
  elif variant == "demo":
    model.mixer, model.pattern = "gdn2", "D"
    model.num_layers, model.width, model.num_heads, model.head_dim, model.value_dim = 2, 64, 2, 32, 32
    # Small enough to learn visibly on a CPU in about two minutes (chance accuracy 1/32).
    data.seq_len, data.batch_size, data.vocab_size = 32, 32, 64
    data.num_kv_pairs = data.num_queries = 4
  else:
    raise ValueError(f"config variant: expected one of {MIXERS + tuple(HYBRIDS) + ('demo',)}, got {variant!r}")
  model.vocab_size = data.vocab_size
  config.model = model

  train = ml_collections.ConfigDict()
  train.steps = 2000 if variant != "demo" else 300
  train.learning_rate = 3e-3 if variant != "demo" else 1e-2
  train.warmup_steps = 100 if variant != "demo" else 10
  train.final_lr_fraction = 0.1
  train.b1, train.b2 = 0.9, 0.95
  train.weight_decay = 0.1
  train.grad_clip = 1.0
  train.log_every = 20 if variant != "demo" else 10
  train.eval_every = 200 if variant != "demo" else 150
  train.eval_batches = 4
  train.checkpoint_every = 200 if variant != "demo" else 50
  train.keep_checkpoints = 3
  train.fsdp = False
  config.train = train
  return config
