r"""The recall study (issue 24): every mixer on MQAR (Zoology's protocol) and on RULER's S-NIAH and MK-NIAH, at
matched parameter counts, the SDM hybrid at the dense GDN model's FLOPs per token.

  python -m experiments.sweep --config=experiments/configs/recall.py:mqar_gdn \
      --grid='variant=mqar_gdn|mqar_kda|mqar_sdm|mqar_attention' --seeds=3 --workdir=runs/recall_mqar

Variants "<task>_<mixer>" or "<task>_<mixer>_w<width>":
  task   mqar (vocab 8192; mixed numbers of key-value pairs, sdm_jax/data/mqar.py) or one of RULER's
         s_niah_1, s_niah_2, s_niah_3, mk_niah_1, mk_niah_2, mk_niah_3 (bytes; sdm_jax/data/niah.py RULER_TASKS)
  mixer  a dense mixer of the registry (gdn, kda, fg2_gdn, fg2_gdn_plus, gdn2: every layer "D"), attention (every
         layer "A"), swa (every layer "S"), sdm (sliding-window attention then Sparse Delta Memory: "SM" at 2 layers,
         "SSSM" at 4, DESIGN.md section 3's 3 : 1)
  width  64, 128 or 256 (default 128), heads of 64 channels (width / 64 of them); MQAR models have 2 layers
         (Zoology's), NIAH models 4.

Matched models (models.costs): every variant's SwiGLU hidden width is solved so that its blocks (mixers, MLPs,
norms; not the embedding, head or SDM table) hold as many parameters as the GDN model of that task and width with
the usual 4 x width SwiGLU; the sdm variant's instead so that its training FLOPs per token equal that GDN model's
(its tables are memory, 2 x 4096 x 64 per SDM layer at width 128, and add state, not FLOPs).
tests/experiments/test_recall_configs.py holds both within 5 %. Sliding windows are 32 tokens: a window whose keys
and values hold as many numbers as a dense mixer's state (H x 32 x 2 x 64 = H x 64 x 64).
"""

import ml_collections

from experiments.configs.common import MIXERS, model_config, train_config
from sdm_jax.data import default_data_config
from sdm_jax.data.niah import RULER_TASKS
from sdm_jax.training.config import close_names

TASKS = ("mqar", *RULER_TASKS)
STUDY_MIXERS = (*MIXERS, "attention", "swa", "sdm")
WIDTHS = (64, 128, 256)
DEFAULT_WIDTH = 128
HEAD_DIM = 64
WINDOW = 32  # H x WINDOW x 2 x HEAD_DIM cached keys and values = H x HEAD_DIM x HEAD_DIM, a dense mixer's state
REFERENCE = "gdn"  # the model every other variant of a task and width is matched to
NAMES = tuple(f"{task}_{mixer}" for task in TASKS for mixer in STUDY_MIXERS)

# MQAR, Zoology's protocol (Arora et al. 2023, section 3 and appendix E): vocabulary 8192, keys and values from
# separate halves of it, 2-layer models of widths 64-256, trained on a mix of numbers of key-value pairs.
MQAR_VOCAB = 8192
# SDM layers at the study's scale: a 64 x 64 product-key table of 64-channel rows per head, top-16 write and read.
SDM_SLOTS, SDM_TOPK, SDM_KEY_DIM = 4096, 16, 32


def parse_variant(variant):
  """'mqar_gdn_w64' -> ('mqar', 'gdn', 64); ValueError naming the variant, with the close names, otherwise."""
  for task in sorted(TASKS, key=len, reverse=True):
    if not variant.startswith(task + "_"):
      continue
    mixer, width = variant[len(task) + 1:], DEFAULT_WIDTH
    head, _, suffix = mixer.rpartition("_w")
    if head and suffix.isdigit():
      mixer, width = head, int(suffix)
    if mixer in STUDY_MIXERS and width in WIDTHS:
      return task, mixer, width
  raise ValueError(f"config variant: expected <task>_<mixer>[_w<width>] with a task in {TASKS}, a mixer in "
                   f"{STUDY_MIXERS} and a width in {WIDTHS}, got {variant!r}{close_names(variant, NAMES)}")


def study_model(mixer, vocab_size, *, num_layers, width):
  """The study's model of `mixer` before matching: heads of HEAD_DIM, impl "auto"."""
  heads = width // HEAD_DIM
  if mixer in MIXERS:
    model = model_config(mixer, vocab_size, num_layers=num_layers, width=width, num_heads=heads, head_dim=HEAD_DIM)
  else:
    model = model_config(REFERENCE, vocab_size, num_layers=num_layers, width=width, num_heads=heads,
                         head_dim=HEAD_DIM)
    model.pattern = {"attention": "A", "swa": "S", "sdm": "S" * (min(num_layers, 4) - 1) + "M"}[mixer]
  model.window = WINDOW
  model.sdm.num_heads, model.sdm.num_slots = heads, SDM_SLOTS
  model.sdm.topk_write = model.sdm.topk_read = SDM_TOPK
  model.sdm.key_dim, model.sdm.value_dim = SDM_KEY_DIM, HEAD_DIM
  return model


def match(model, reference, seq_len, by):
  """Sets model.mlp_ratio so that its block parameters (by="params") or its training FLOPs per token
  (by="flops") equal the reference model's; both are linear in the SwiGLU hidden width h (3 x width x h
  parameters a layer)."""
  from sdm_jax.models import costs
  measure = {"params": lambda m: costs.param_counts(m)["blocks"],
             "flops": lambda m: costs.flops_per_token(m, seq_len)}[by]
  per_unit = 3 * model.width * model.num_layers * (6 if by == "flops" else 1)
  hidden = round(model.mlp_ratio * model.width)
  hidden += round((measure(reference) - measure(model)) / per_unit)
  if hidden < 1:
    raise ValueError(f"{model.pattern} at width {model.width}: no SwiGLU width matches the reference's {by}")
  model.mlp_ratio = hidden / model.width
  return model


def get_config(variant="mqar_gdn"):
  task, mixer, width = parse_variant(variant)
  config = ml_collections.ConfigDict()
  config.seed = 0
  if task == "mqar":
    data = default_data_config("mqar")
    data.vocab_size, data.seq_len, data.batch_size = MQAR_VOCAB, 128, 64
    data.num_kv_pairs = data.num_queries = 16
    data.min_kv_pairs = 4  # examples of 16, 8 and 4 pairs
    num_layers = 2
    config.train = train_config(4000, 3e-3, warmup_steps=100, log_every=50, eval_every=500, checkpoint_every=500)
  else:
    data = default_data_config("niah")
    data.update(RULER_TASKS[task])
    data.seq_len, data.batch_size = 1024, 16
    num_layers = 4
    config.train = train_config(3000, 1e-3, warmup_steps=200, log_every=50, eval_every=500, checkpoint_every=500)
  config.data = data
  model = study_model(mixer, data.vocab_size, num_layers=num_layers, width=width)
  reference = study_model(REFERENCE, data.vocab_size, num_layers=num_layers, width=width)
  # Zoology's models tie the head to the embedding; over 4096 values an untied head stays at chance for
  # thousands of steps (benchmarks/recall/README.md). NIAH's 258 bytes each occur thousands of times a batch.
  model.tie_embeddings = reference.tie_embeddings = task == "mqar"
  if mixer != REFERENCE:
    match(model, reference, data.seq_len, "flops" if mixer == "sdm" else "params")
  config.model = model
  return config
