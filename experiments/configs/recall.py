r"""The recall study (issues 24 and 48): every mixer on MQAR (Zoology's protocol) and on RULER's S-NIAH and MK-NIAH,
at matched parameter counts, the SDM hybrid and its control at the dense GDN model's FLOPs per token.

  python -m experiments.sweep --config=experiments/configs/recall.py:mqar_gdn \
      --grid='variant=mqar_gdn|mqar_kda|mqar_sdm|mqar_attention' --seeds=5 --workdir=runs/recall_mqar

Variants "<task>_<mixer>[_w<width>][_lr<rate>]":
  task   mqar (vocab 8192; mixed numbers of key-value pairs, sdm_jax/data/mqar.py) or one of RULER's
         s_niah_1, s_niah_2, s_niah_3, mk_niah_1, mk_niah_2, mk_niah_3 (bytes; sdm_jax/data/niah.py RULER_TASKS)
  mixer  a dense mixer of the registry (gdn, kda, fg2_gdn, fg2_gdn_plus, gdn2: every layer "D"), attention (every
         layer "A", with ATTENTION_CONV-tap short convolutions after q, k, v, as the dense layers have and as Zoology's
         Based experiments give their attention baseline: without them 2-layer attention must first learn a
         previous-token head, and on MQAR it stays near the guess among unrecalled values for over 10,000 steps,
         benchmarks/recall/README.md), swa (every layer "S"), sdm (sliding-window attention then Sparse Delta
         Memory: "SM" at 2 layers, "SSSM" at 4, DESIGN.md section 3's 3 : 1), swa_gdn (the sdm hybrid's control: GDN
         in SDM's place, "SD" and "SSSD")
  width  64, 128 or 256 (default 128), heads of 64 channels (width / 64 of them); MQAR models have 2 layers
         (Zoology's), NIAH models 4.
  rate   the peak learning rate, e.g. "_lr3e-3" (default: the task's, below): the protocol runs each model at the
         rate its pilot picked (benchmarks/recall/protocol.sh), one sweep for every model.

Matched models (models.costs): every variant's SwiGLU hidden width is solved so that its blocks (mixers, MLPs,
norms; not the embedding, head or SDM table) hold as many parameters as the GDN model of that task and width with
the usual 4 x width SwiGLU; the sdm and swa_gdn variants' instead so that their training FLOPs per token equal that
GDN model's (SDM's tables are memory, 2 x 4096 x 64 per SDM layer at width 128, and add state, not FLOPs). SDM writes
and reads W = R = 64 slots a token, the GDN state's d_k (HEAD_DIM): the iso-FLOP comparison of the SDM paper.
tests/experiments/test_recall_configs.py holds both within 5 %. Sliding windows are 32 tokens: a window whose keys
and values hold as many numbers as a dense mixer's state (H x 32 x 2 x 64 = H x 64 x 64).

The protocol (issue 48; benchmarks/recall/README.md "Protocol", run by benchmarks/recall/protocol.sh): every run
stops at its first evaluation whose accuracy reaches STOP_AT_ACCURACY (train.stop_at_accuracy; the step is its
steps-to-threshold) or at the task's steps; each model's learning rate is picked from LEARNING_RATES on a pilot;
MQAR goes across state pressure (PRESSURE_POINTS: pairs from a quarter of d_k to 4 d_k per head) at
PRESSURE_WIDTHS; SEEDS seeds; a seed succeeds at SUCCESS accuracy; CLAIMS are the papers' claims it decides.
"""

import json
import pathlib
import re

import ml_collections

from experiments.configs.common import MIXERS, model_config, train_config
from sdm_jax.data import default_data_config
from sdm_jax.data.niah import RULER_TASKS
from sdm_jax.training.config import close_names

TASKS = ("mqar", *RULER_TASKS)
STUDY_MIXERS = (*MIXERS, "attention", "swa", "sdm", "swa_gdn")
WIDTHS = (64, 128, 256)
DEFAULT_WIDTH = 128
HEAD_DIM = 64
ATTENTION_CONV = 4  # the dense layers' short convolution (their presets')
WINDOW = 32  # H x WINDOW x 2 x HEAD_DIM cached keys and values = H x HEAD_DIM x HEAD_DIM, a dense mixer's state
REFERENCE = "gdn"  # the model every other variant of a task and width is matched to
NAMES = tuple(f"{task}_{mixer}" for task in TASKS for mixer in STUDY_MIXERS)

# MQAR, Zoology's protocol (Arora et al. 2023, section 3 and appendix E): vocabulary 8192, keys and values from
# separate halves of it, 2-layer models of widths 64-256, trained on a mix of numbers of key-value pairs.
MQAR_VOCAB = 8192
# SDM layers at the study's scale: a 64 x 64 product-key table of 64-channel rows per head; W = R = HEAD_DIM slots
# written and read a token (the SDM paper's iso-FLOP setting against a dense state of d_k = HEAD_DIM).
SDM_SLOTS, SDM_TOPK, SDM_KEY_DIM = 4096, HEAD_DIM, 32
# The hybrids: their last layer is SDM's (or GDN's, the control), the others sliding windows, 3 : 1 at 4 layers.
HYBRID_LAST_LAYER = {"sdm": "M", "swa_gdn": "D"}

# The protocol (module docstring). Zoology sweeps log-spaced learning rates between 1e-4 and 1e-2 per model; the grid
# is the decade around the rate these models learned MQAR at (3e-3; benchmarks/recall/README.md's history), the
# lower rates left out for the GPU time they would triple.
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
STOP_AT_ACCURACY = 0.99
SUCCESS = 0.9
SEEDS = 5
# (seq_len, pairs): queries = pairs, trained on the halvings of the pairs down to 4 and evaluated at the pairs alone;
# seq_len = 4 x pairs (the pairs and their queries fill it), at least 128. Pairs / d_k per head: 0.25 to 4.
PRESSURE_POINTS = ((128, 16), (128, 32), (256, 64), (512, 128), (1024, 256))
PRESSURE_WIDTHS = (128, 256)
# The learning-rate pilots: MQAR at d_k pairs per head, where the models differ but learn; NIAH on the multi-key task
# the first claim names, at its training length.
PILOT_WIDTH, PILOT_POINT, NIAH_PILOT_TASK = 128, (256, 64), "mk_niah_1"
MQAR_STEPS, NIAH_STEPS = 4000, 6000
# The papers' claims the study decides: (claim, [(A, B): A is claimed to beat B], the tasks that bear on it).
# Models are STUDY_MIXERS names.
CLAIMS = (
    ("GDN-2 beats KDA and GDN on multi-key retrieval (GDN-2 paper: MK-NIAH-1 at 4K, 37.8 vs 28.0 vs 27.8)",
     (("gdn2", "kda"), ("gdn2", "gdn")), ("mqar", "mk_niah_1", "mk_niah_2", "mk_niah_3")),
    ("SDM beats GDN on RULER at iso-FLOP (SDM paper: 31.2 vs 20.0); the control: SDM, not the windows",
     (("sdm", "gdn"), ("sdm", "swa_gdn")), ("mqar", *RULER_TASKS)),
    ("FG2-GDN(+) beats KDA and GDN on single- and multi-key retrieval",
     (("fg2_gdn", "kda"), ("fg2_gdn", "gdn"), ("fg2_gdn_plus", "kda"), ("fg2_gdn_plus", "gdn")),
     ("mqar", *RULER_TASKS)),
)
_RATE = re.compile(r"_lr(\d+(?:\.\d*)?(?:e-?\d+)?)$")


def parse_variant(variant):
  """'mqar_gdn_w64' -> ('mqar', 'gdn', 64, None), 'mqar_gdn_lr3e-3' -> ('mqar', 'gdn', 128, 0.003); ValueError naming
  the variant, with the close names, otherwise."""
  rate = _RATE.search(variant)
  name = variant[:rate.start()] if rate else variant
  for task in sorted(TASKS, key=len, reverse=True):
    if not name.startswith(task + "_"):
      continue
    mixer, width = name[len(task) + 1:], DEFAULT_WIDTH
    head, _, suffix = mixer.rpartition("_w")
    if head and suffix.isdigit():
      mixer, width = head, int(suffix)
    if mixer in STUDY_MIXERS and width in WIDTHS and (rate is None or float(rate.group(1)) > 0):
      return task, mixer, width, float(rate.group(1)) if rate else None
  raise ValueError(f"config variant: expected <task>_<mixer>[_w<width>][_lr<rate>] with a task in {TASKS}, a mixer "
                   f"in {STUDY_MIXERS}, a width in {WIDTHS} and a rate above 0, got {variant!r}"
                   f"{close_names(name, NAMES)}")


def variant_name(task, mixer, width, rate=None):
  """parse_variant's inverse: ('mqar', 'gdn', 128, 0.003) -> 'mqar_gdn_w128_lr0.003'."""
  return f"{task}_{mixer}_w{width}" + (f"_lr{rate:g}" if rate is not None else "")


def task_family(task):
  """"mqar" or "niah": which pilot's learning rates a task's runs take."""
  return "mqar" if task == "mqar" else "niah"


def protocol_variants(task, mixers, widths, rates=None, picked=None):
  """'v1|v2|...': the variants of `task` for every mixer and width (space-separated text or sequences), at every rate
  of `rates` (the pilot's grid), or at each mixer's rate in the `picked` JSON file ({family: {mixer: rate}}, the
  pilot report's); ValueError naming a mixer the pilot did not rate."""
  split = lambda value: value.split() if isinstance(value, str) else list(value)
  names = []
  for mixer in split(mixers):
    if picked is not None:
      family = task_family(task)
      table = json.loads(pathlib.Path(picked).read_text()).get(family, {})
      if mixer not in table:
        raise ValueError(f"picked: {picked} has no {family} learning rate for {mixer!r} (it has {sorted(table)}); run "
                         f"its pilot or give the rates")
      mixer_rates = [table[mixer]]
    else:
      mixer_rates = [float(rate) for rate in split(rates)] if rates is not None else [None]
    names += [variant_name(task, mixer, int(width), rate) for width in split(widths) for rate in mixer_rates]
  return "|".join(names)


def study_model(mixer, vocab_size, *, num_layers, width):
  """The study's model of `mixer` before matching: heads of HEAD_DIM, impl "auto"."""
  heads = width // HEAD_DIM
  if mixer in MIXERS:
    model = model_config(mixer, vocab_size, num_layers=num_layers, width=width, num_heads=heads, head_dim=HEAD_DIM)
  else:
    model = model_config(REFERENCE, vocab_size, num_layers=num_layers, width=width, num_heads=heads,
                         head_dim=HEAD_DIM)
    hybrid = {name: "S" * (min(num_layers, 4) - 1) + last for name, last in HYBRID_LAST_LAYER.items()}
    model.pattern = {"attention": "A", "swa": "S", **hybrid}[mixer]
  model.window = WINDOW
  if mixer == "attention":
    model.attention_conv = ATTENTION_CONV
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
  task, mixer, width, rate = parse_variant(variant)
  config = ml_collections.ConfigDict()
  config.seed = 0
  if task == "mqar":
    data = default_data_config("mqar")
    data.vocab_size, data.seq_len, data.batch_size = MQAR_VOCAB, 128, 64
    data.num_kv_pairs = data.num_queries = 16
    data.min_kv_pairs = 4  # examples of 16, 8 and 4 pairs
    num_layers = 2
    config.train = train_config(MQAR_STEPS, 3e-3, warmup_steps=100, log_every=50, eval_every=250,
                                checkpoint_every=500)
  else:
    data = default_data_config("niah")
    data.update(RULER_TASKS[task])
    data.seq_len, data.batch_size = 1024, 16
    num_layers = 4
    config.train = train_config(NIAH_STEPS, 1e-3, warmup_steps=200, log_every=50, eval_every=500,
                                checkpoint_every=500)
  config.train.stop_at_accuracy = STOP_AT_ACCURACY
  if rate is not None:
    config.train.learning_rate = rate
  config.data = data
  model = study_model(mixer, data.vocab_size, num_layers=num_layers, width=width)
  reference = study_model(REFERENCE, data.vocab_size, num_layers=num_layers, width=width)
  # Zoology's models tie the head to the embedding; over 4096 values an untied head stays at chance for
  # thousands of steps (benchmarks/recall/README.md). NIAH's 258 bytes each occur thousands of times a batch.
  model.tie_embeddings = reference.tie_embeddings = task == "mqar"
  if mixer != REFERENCE:
    match(model, reference, data.seq_len, "flops" if mixer in HYBRID_LAST_LAYER else "params")
  config.model = model
  return config
