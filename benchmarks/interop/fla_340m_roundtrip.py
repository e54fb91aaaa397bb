"""fla's KDA at the 340M shape, both ways, on one GPU (issue 47's show; needs fla 0.6.0, torch, transformers):

    PYTHONPATH=<site with fla>:. python3 benchmarks/interop/fla_340m_roundtrip.py --out /tmp/roundtrip

1. fla's `KDAForCausalLM` (width 1024, 24 layers, 8 heads of 128, vocabulary 32,000: the paper config kda_340m),
   freshly initialised by fla and saved with `save_pretrained`;
2. `sdm_jax.interop.load_fla` reads it; both models score the same batch in bf16 (fla: the model cast to bf16;
   ours: bf16 compute, fp32 parameters), and the two losses are compared;
3. ours trains 100 AdamW steps (`training.steps.TrainStep`) on a fixed set of batches whose second half repeats its
   first (learnable by recall), printing the loss;
4. `save_fla` writes the trained model, fla's `AutoModelForCausalLM.from_pretrained` loads it, and fla's loss on the
   batch is compared with ours.
Prints one JSON line per stage and writes them to <out>/roundtrip.json.
"""

import argparse
import json
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")  # torch shares the card

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import torch
from flax import nnx

from sdm_jax.interop import load_fla, save_fla
from sdm_jax.models.loss import loss_fn
from sdm_jax.training.optimizer import make_optimizer
from sdm_jax.training.steps import TrainStep

SHAPE = dict(hidden_size=1024, num_hidden_layers=24, num_heads=8, head_dim=128, vocab_size=32000)
B, T = 4, 2048


def batches(count, seed=0):
  """count batches of B rows: T/2 random tokens, then the same T/2 again (the second half is predictable)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    half = rng.integers(1, SHAPE["vocab_size"], (B, T // 2 + 1))
    row = np.concatenate([half, half[:, 1:]], axis=1)[:, :T + 1]
    out.append({"inputs": row[:, :-1].astype(np.int32), "targets": row[:, 1:].astype(np.int32),
                "mask": np.ones((B, T), np.float32)})
  return out


def fla_loss(model, batch):
  with torch.no_grad():
    logits = model(input_ids=torch.as_tensor(batch["inputs"]).long().cuda()).logits.float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                             torch.as_tensor(batch["targets"]).long().cuda().flatten()).item()


def ours_loss(model, batch):
  loss, _ = nnx.jit(loss_fn)(model, {k: jnp.asarray(v) for k, v in batch.items()})
  return float(loss)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--steps", type=int, default=100)
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  from fla.models import KDAConfig, KDAForCausalLM
  from transformers import AutoModelForCausalLM
  records = []
  def record(**fields):
    records.append(fields)
    print(json.dumps(fields), flush=True)
    with open(os.path.join(args.out, "roundtrip.json"), "w") as f:
      json.dump({"device": torch.cuda.get_device_name(), "records": records}, f, indent=1)

  data = batches(9)
  probe = data[-1]
  torch.manual_seed(0)
  fla_model = KDAForCausalLM(KDAConfig(**SHAPE)).cuda()
  fla_dir = os.path.join(args.out, "fla_init")
  fla_model.save_pretrained(fla_dir, safe_serialization=True)
  fla_model = fla_model.to(torch.bfloat16).eval()
  fla_before = fla_loss(fla_model, probe)
  del fla_model
  torch.cuda.empty_cache()

  model, config = load_fla(fla_dir, dtype="bfloat16")
  ours_before = ours_loss(model, probe)
  record(stage="load", fla_loss=fla_before, ours_loss=ours_before, abs_diff=abs(fla_before - ours_before),
         params=int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))))

  train = ml_collections.ConfigDict(dict(learning_rate=1e-3, warmup_steps=10, steps=args.steps, grad_clip=1.0,
                                         b1=0.9, b2=0.95, weight_decay=0.1, schedule="cosine", final_lr_fraction=0.1))
  step = TrainStep(model, make_optimizer(model, train))
  losses, start = [], time.perf_counter()
  for i in range(args.steps):
    metrics = step({k: jnp.asarray(v) for k, v in data[i % 8].items()})
    if i % 10 == 0 or i == args.steps - 1:
      losses.append((i, float(metrics["loss"])))
  step.sync()
  ours_after = ours_loss(model, probe)
  record(stage="train", steps=args.steps, losses=losses, seconds=time.perf_counter() - start, ours_loss=ours_after)

  out_dir = os.path.join(args.out, "ours_trained")
  save_fla(model, config, out_dir)
  import fla  # noqa: F401  (registers fla's model types with transformers' Auto classes)
  back = AutoModelForCausalLM.from_pretrained(out_dir).cuda().to(torch.bfloat16).eval()
  fla_after = fla_loss(back, probe)
  record(stage="export", fla_loss=fla_after, ours_loss=ours_after, abs_diff=abs(fla_after - ours_after),
         architecture=type(back).__name__)


if __name__ == "__main__":
  main()
