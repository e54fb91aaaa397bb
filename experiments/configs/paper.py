r"""Paper-size language models: every mixer and hybrid at flash-linear-attention's 340M and 1.3B shapes, and at
the whole-model reference shape of DESIGN.md section 7.

  python -m experiments.train --config=experiments/configs/paper.py:kda_340m --workdir=runs/kda_340m

Variants "<name>_<size>": name is a mixer, gdn, kda, fg2_gdn, fg2_gdn_plus, gdn2 (pattern "D"), or a hybrid,
gdn2_swa ("DS"), fg2_attn ("DDDA"), sdm ("SSSM"); size is one of

  340m  24 layers, width 1024,  8 heads x 128, SwiGLU 2816, 128 x 4096 tokens a step, 20,480 steps (10.7B tokens)
  1.3b  24 layers, width 2048, 16 heads x 128, SwiGLU 5632, 128 x 4096 tokens a step, 190,735 steps (100B tokens)
  ref    8 layers, width 2048, 16 heads x 128, SwiGLU 5632,   4 x 4096 tokens a step (DESIGN.md section 7)

so e.g. kda_340m, gdn2_swa_1.3b, sdm_ref. Every variant: vocabulary 32,000, bf16 compute (fp32 parameters),
impl "auto", K = V = 128 per head; attention layers (S, A) use the mixers' heads, sliding windows 2048 tokens.
SDM layers at the paper's scale (DESIGN.md section 3): 2 heads, 65,536 slots, top-128 write and read, values of
1024 per head, sub-keys of 128 (the addressing width of the sdm benchmark mode). The SDM tables are parameters
(2 x 65,536 x 1024 per SDM layer, 805M in the 6 SDM layers of 24), so an sdm variant has far more parameters
than its size names; without the tables it is within 7 % of it.

Where the shapes come from (flash-linear-attention and flame, its trainer): heads of 128 with expand_v 1 are
fla's KDA and GDN-2 layer defaults (fla/models/kda/configuration_kda.py: 24 layers, width 2048, 16 heads x
128, the 1.3B shape) and flame's DeltaNet 340M (configs/delta_net_340M.json: 24 layers, width 1024, 8 heads,
expand_k = expand_v = 1); the SwiGLU hidden is fla's GatedMLP rule for hidden_ratio 4, 2/3 * 4 * width rounded
up to a multiple of 256 (fla/modules/mlp.py), 2.75 x width at both widths; the attention layers of a hybrid
follow fla's Samba (flame configs/samba_1B.json: attention at the odd layers, window_size 2048), which "DS"
places the same way. flame's Gated DeltaNet configs (configs/gated_deltanet_340M.json, _1B.json) differ: 21
layers of 6 heads x 256 with expand_v 2; here every mixer keeps one shape, so the mixers compare at equal
state size. Training is flame's recipe (flame/models/fla.toml, examples/training.md in fla): AdamW at 3e-4,
1024 warmup steps, cosine to 0.1 of the peak, clipping at 1.0, 0.5M tokens a step (32 x 2048 on each of 8
GPUs there; 128 x 4096 here), 20,480 steps for 340M; the 1.3B models are the "1.3B-100B" of fla-hub's names,
100B tokens. data.batch_size is global; one step runs it as train.gradient_accumulation_steps microbatches of
MICROBATCH rows (32 of 4 x 4096 tokens for 340m and 1.3b), so the recipe runs unchanged on one GPU; with more
devices, lower the accumulation (each microbatch divides over the devices) or set train.fsdp.

The size names count parameters as fla's do, the embedding as if tied to the head (flame's 24-layer,
width-1024 DeltaNet and Transformer come to about 341M that way): GDN and KDA land within 8 % of theirs;
FG2-GDN, FG2-GDN+ and GDN-2 lie 16-25 % above, by their channel-wise gates, each a full width -> H * K (or
H * V) projection (tests/experiments/test_paper_configs.py holds both).

Data: the "corpus" task (sdm_jax/data/corpus.py), documents packed into rows with their segment ids, from
the directory after the variant ("kda_340m,DATA_DIR"; default data/stdlib). Prepare it with a tokenizer of at
most 32,000 entries, e.g. the offline default trained to that size:

  python -m experiments.prepare_data --tokenizer=train:32000 --out=data/stdlib
"""

import ml_collections

from experiments.configs.common import VARIANTS, model_config, train_config
from sdm_jax.training.config import close_names
from sdm_jax.data import default_data_config

VOCAB_SIZE = 32000
# (layers, width, heads, SwiGLU hidden, batch, steps); head_dim = value_dim = 128 everywhere.
SIZES = {
    "340m": (24, 1024, 8, 2816, 128, 20480),
    "1.3b": (24, 2048, 16, 5632, 128, 190735),
    "ref": (8, 2048, 16, 5632, 4, 20480),
}
HEAD_DIM = 128
SEQ_LEN = 4096
# Rows of one microbatch: the shape measured on one GPU, KDA 340M at 4 x 4096 peaking at 23.8 GiB on an H200
# (benchmarks/train/README.md).
MICROBATCH = 4
WINDOW = 2048
NAMES = tuple(f"{name}_{size}" for size in SIZES for name in VARIANTS)


def get_config(argument="kda_340m"):
  variant, _, data_dir = argument.partition(",")
  name, _, size = variant.rpartition("_")
  if name not in VARIANTS or size not in SIZES:
    raise ValueError(f"config variant: expected <mixer or hybrid>_<size> with a mixer or hybrid in {VARIANTS} "
                     f"and a size in {tuple(SIZES)}, got {variant!r}{close_names(variant, NAMES)}")
  num_layers, width, num_heads, mlp_hidden, batch_size, steps = SIZES[size]
  config = ml_collections.ConfigDict()
  config.seed = 0
  data = default_data_config("corpus")
  if data_dir:
    data.data_dir = data_dir
  data.vocab_size = VOCAB_SIZE
  data.seq_len, data.batch_size = SEQ_LEN, batch_size
  config.data = data
  model = model_config(name, VOCAB_SIZE, num_layers=num_layers, width=width, num_heads=num_heads,
                       head_dim=HEAD_DIM)
  model.num_layers = num_layers  # model_config gives a hybrid its small default depth
  model.mlp_ratio = mlp_hidden / width  # 2.75: round(mlp_ratio * width) is fla's hidden exactly
  model.window = WINDOW
  model.dtype = "bfloat16"
  # Keeps the matmuls' outputs and the Pallas kernels' results, recomputes the elementwise rest: within fla's
  # peak memory at the reference shape and within 3 % of no remat (benchmarks/train/).
  model.remat = "dots_kernels"
  model.sdm.num_heads, model.sdm.num_slots, model.sdm.value_dim, model.sdm.key_dim = 2, 65536, 1024, 128
  model.sdm.topk_write = model.sdm.topk_read = 128
  config.model = model
  config.train = train_config(steps, 3e-4, warmup_steps=1024, log_every=50, eval_every=2048,
                              checkpoint_every=2048)
  config.train.gradient_accumulation_steps = max(1, batch_size // MICROBATCH)
  return config

