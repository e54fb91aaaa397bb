"""Writes the golden files the interop tests read (tests/interop/golden/), with flash-linear-attention itself.

Run once on a GPU with fla 0.6.0 (its Triton kernels need one), torch and transformers:

    PYTHONPATH=<site with fla>:. python3 tests/interop/make_fla_goldens.py --out tests/interop/golden

What it writes, all fp32 and small (tiny random shapes):
- layer_<kind>.safetensors for kind in gdn, kda, gdn2: one fla layer's state dict (fla's `GatedDeltaNet`,
  `KimiDeltaAttention`, `GatedDeltaNet2` at hidden 64, 2 heads of 32, every other argument at fla's default), and
  layer_<kind>_io.safetensors: an input x [2, 48, 64] and the layer's output y. kind kda_safe_gate is
  `KimiDeltaAttention` with SAFE_GATE (its gate lower_bound * sigmoid(exp(A_log) (f(x) + dt_bias))), drawn from a
  generator of its own so that the other files do not change with it; fla's GDN-2 layer has no safe gate.
- model_<kind>/ for kind in gdn (tied head) and kda (own head): `save_pretrained` of fla's
  `GatedDeltaNetForCausalLM` / `KDAForCausalLM` (2 layers, width 64), and model_<kind>_io.safetensors: tokens
  [2, 40] and fla's logits.
- init_<kind>.json: the mean and standard deviation of every tensor of a freshly initialised fla model (width 256),
  what the `fla` initialisation preset is held to.
Every parameter of the layers and models is redrawn at a scale where it visibly changes the output (fla's own init
leaves biases at 0 and norms at 1, which would hide a misplaced bias or norm), so a wrong mapping cannot pass.

Outputs come from fla's `fused_recurrent` kernels (fla picks them itself without gradients at <= 64 tokens), which
use no matrix units, so the fp32 goldens are exact to fp32 rounding rather than TF32.
"""

import argparse
import json
import math
import os
import platform

import torch
from safetensors.torch import save_file

LAYER_SHAPE = dict(hidden_size=64, num_heads=2, head_dim=32)
MODEL_SHAPE = dict(vocab_size=300, hidden_size=64, num_heads=2, head_dim=32, num_hidden_layers=2)
INIT_SHAPE = dict(vocab_size=1000, hidden_size=256, num_heads=2, head_dim=128, num_hidden_layers=2)
SAFE_GATE = dict(safe_gate=True, lower_bound=-5.0)  # fla's recommended bound


def redraw(module, generator):
  """Every parameter at a scale where it matters: weights ~ N(0, 1 / fan_in), biases and norm offsets ~ 0.1."""
  with torch.no_grad():
    for name, p in module.named_parameters():
      noise = torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.device)
      leaf = name.rsplit(".", 1)[-1]
      if leaf == "A_log":
        p.copy_(torch.log(1 + 15 * torch.rand(p.shape, generator=generator)).to(p.device))
      elif leaf == "dt_bias" or leaf == "bias":
        p.copy_(0.3 * noise)
      elif "norm" in name:
        p.copy_(1 + 0.2 * noise)
      elif "embeddings" in name:
        p.copy_(noise)
      elif "conv1d" in name:
        p.copy_(0.5 * noise)
      else:
        p.copy_(noise / math.sqrt(p.shape[-1]))


def layer_classes():
  """{kind: (fla's layer class, its arguments beyond LAYER_SHAPE)}."""
  from fla.layers import GatedDeltaNet, GatedDeltaNet2, KimiDeltaAttention
  return {"gdn": (GatedDeltaNet, {}), "kda": (KimiDeltaAttention, {}), "gdn2": (GatedDeltaNet2, {}),
          "kda_safe_gate": (KimiDeltaAttention, SAFE_GATE)}


def layers(out, generator, kinds):
  for kind in kinds:
    cls, arguments = layer_classes()[kind]
    layer = cls(**LAYER_SHAPE, **arguments).cuda().float().eval()
    redraw(layer, generator)
    x = torch.randn(2, 48, LAYER_SHAPE["hidden_size"], generator=generator).cuda()
    with torch.no_grad():
      y = layer(x)[0]
    save_file({k: v.detach().cpu().contiguous() for k, v in layer.state_dict().items()},
              os.path.join(out, f"layer_{kind}.safetensors"))
    save_file({"x": x.cpu(), "y": y.float().cpu()}, os.path.join(out, f"layer_{kind}_io.safetensors"))
    print(f"layer {kind}: y rms {y.float().pow(2).mean().sqrt().item():.4f}")


def model_classes():
  from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM, KDAConfig, KDAForCausalLM
  return {"gdn": (GatedDeltaNetConfig, GatedDeltaNetForCausalLM, True),
          "kda": (KDAConfig, KDAForCausalLM, False)}


def models(out, generator):
  for kind, (config_cls, model_cls, tied) in model_classes().items():
    config = config_cls(**MODEL_SHAPE, tie_word_embeddings=tied, fuse_cross_entropy=False)
    model = model_cls(config).cuda().float().eval()
    redraw(model, generator)
    if tied:
      assert model.lm_head.weight.data_ptr() == model.model.embeddings.weight.data_ptr()
    tokens = torch.randint(0, MODEL_SHAPE["vocab_size"], (2, 40), generator=generator).cuda()
    with torch.no_grad():
      logits = model(input_ids=tokens).logits.float()
    model.save_pretrained(os.path.join(out, f"model_{kind}"), safe_serialization=True)
    save_file({"tokens": tokens.to(torch.int32).cpu(), "logits": logits.cpu()},
              os.path.join(out, f"model_{kind}_io.safetensors"))
    print(f"model {kind}: logits rms {logits.pow(2).mean().sqrt().item():.4f}")


def init_stats(out):
  for kind, (config_cls, model_cls, _) in model_classes().items():
    torch.manual_seed(0)
    model = model_cls(config_cls(**INIT_SHAPE))
    stats = {name: {"mean": p.float().mean().item(), "std": p.float().std().item(), "numel": p.numel()}
             for name, p in model.named_parameters()}
    with open(os.path.join(out, f"init_{kind}.json"), "w") as f:
      json.dump({"shape": INIT_SHAPE, "tensors": stats}, f, indent=1, sort_keys=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  import fla
  import transformers
  generator = torch.Generator().manual_seed(0)
  layers(args.out, generator, ("gdn", "kda", "gdn2"))
  models(args.out, generator)
  init_stats(args.out)
  layers(args.out, torch.Generator().manual_seed(1), ("kda_safe_gate",))
  with open(os.path.join(args.out, "versions.json"), "w") as f:
    json.dump({"fla": fla.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
               "device": torch.cuda.get_device_name(), "python": platform.python_version()}, f, indent=1)


if __name__ == "__main__":
  main()
