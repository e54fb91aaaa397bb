r"""Whole-model training steps of flash-linear-attention's HF models (the peer of DESIGN.md section 7), in torch.

  python -m sdm_jax.benchmarking.peer_train --model=kda --num_layers=8 --width=2048 --num_heads=16 \
    --head_dim=128 --mlp_hidden=5632 --vocab_size=32000 --batch=4 --seq_len=4096 --steps=20 --warmup=3 \
    --out=/tmp/results/peer_train_kda.json

One process per side: this one imports torch and fla and never jax; our JAX model is timed in another
process of the same device call. torch is imported inside `run`, so `peer_kwargs` (what is built) is
testable on a machine without torch.

What fla 0.6.0 does, read from its source:
- Mixed precision: parameters stay fp32 and the forward runs under torch.autocast(cuda, bfloat16). That
  is how flame (torchtitan) trains on one device (`maybe_enable_amp`: FSDP casts parameters itself,
  single-device and DDP runs get autocast), and fla's kernels are written for it: the fused norms
  emit the autocast dtype, A_log and dt_bias are fp32 parameters in every layer, the fused linear
  cross-entropy accumulates the head's gradient in fp32 and casts it to the parameter's dtype.
- The loss: `labels` are the inputs; `FLAPreTrainedModel._compute_logits_and_loss` shifts them
  (`labels[:, 1:]` then ignore_index at the last position) and takes the mean over the B x (T - 1)
  kept positions. KDAForCausalLM in training uses FusedLinearCrossEntropyLoss (the head and the loss
  in 8 token chunks, the full logits never held; its forward passes
  fuse_linear_cross_entropy=config.fuse_cross_entropy and self.training). GatedDeltaNetForCausalLM and
  TransformerForCausalLM read config.fuse_linear_cross_entropy (default False) and with
  fuse_cross_entropy (default True) apply FusedCrossEntropyLoss to the materialised [B*T, vocab]
  logits. Which one ran is read back from the output (its logits are None under the fused linear
  loss) and written to the result.
- TransformerForCausalLM's attention (fla/layers/attn.py) raises ImportError in its constructor when
  the flash_attn package is missing; GatedDeltaNet's chunk kernel refuses on Triton 3.6 (DESIGN.md
  section 7). Either failure, like any other, is written to the result's "error" and the process
  exits 0 so the caller goes on.

The result JSON is rewritten at every stage, with "error" saying where the process was, so a crash
(a segfault in a Triton compile, a kill at the time limit) still leaves the last stage reached.
fla autotunes its Triton kernels on first use (minutes); TRITON_CACHE_DIR is taken from the
environment as it is.
"""

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import traceback

from sdm_jax import jsonio  # plain Python: this process still imports no jax

# name: (fla config class, model class, config options beyond the shape). kda_safe_gate is KDA with fla's bounded
# decay (every layer's gate lower_bound * sigmoid(...), its kernels in safe_gate mode at fla's recommended bound),
# the peer of ours with model.delta.lower_bound=-5.
MODELS = {
    "kda": ("KDAConfig", "KDAForCausalLM", {}),
    "kda_safe_gate": ("KDAConfig", "KDAForCausalLM", {"safe_gate": True, "lower_bound": -5.0}),
    "gdn": ("GatedDeltaNetConfig", "GatedDeltaNetForCausalLM", {}),
    "attention": ("TransformerConfig", "TransformerForCausalLM", {}),
}
LEARNING_RATE, BETAS, WEIGHT_DECAY, CLIP_NORM = 1e-4, (0.9, 0.95), 0.1, 1.0


def peer_kwargs(model, num_layers, width, num_heads, head_dim, mlp_hidden, vocab_size):
  """(fla config class name, its keyword arguments) for `model` in MODELS at the given shape.

  fla's fused norm, SwiGLU and cross-entropy are on (its defaults, written out so the record shows
  them); the head is untied. The delta-rule mixers get expand_v=1.0, d_v = d_k = head_dim as in
  DESIGN.md section 7 (fla's GatedDeltaNetConfig defaults to expand_v=2.0). fla's Transformer has no
  head_dim of its own (it is width / num_heads), so `attention` needs width == num_heads * head_dim.
  """
  if model not in MODELS:
    raise ValueError(f"model: expected one of {sorted(MODELS)}, got {model!r}")
  kwargs = dict(hidden_size=width, num_hidden_layers=num_layers, num_heads=num_heads,
                intermediate_size=mlp_hidden, vocab_size=vocab_size, tie_word_embeddings=False,
                fuse_norm=True, fuse_swiglu=True, fuse_cross_entropy=True)
  if model == "attention":
    if width != num_heads * head_dim:
      raise ValueError(f"head_dim: fla's Transformer uses width / num_heads = {width} / {num_heads} per head, "
                       f"so head_dim must be {width // num_heads if num_heads else '?'}, got {head_dim}")
  else:
    kwargs.update(head_dim=head_dim, expand_v=1.0)
  return MODELS[model][0], {**kwargs, **MODELS[model][2]}


def _log(start, message):
  print(f"[peer_train {time.perf_counter() - start:8.1f} s] {message}", flush=True)


def _write(path, result):
  if path is None:
    return
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  partial = path + ".partial"
  with open(partial, "w") as f:
    f.write(jsonio.dumps(result, indent=2, default=str))
  os.replace(partial, path)


def _versions():
  versions = {"python": sys.version.split()[0]}
  for name in ("torch", "triton", "transformers", "fla", "einops"):
    try:
      versions[name] = getattr(__import__(name), "__version__", "?")
    except Exception as error:  # a missing or broken package is a fact to record, not a reason to stop
      versions[name] = f"unavailable: {type(error).__name__}: {error}"
  return versions


def _build(model, kwargs, seed):
  """(the fla model in training mode with fp32 parameters on cuda, its config)."""
  import torch
  if model == "attention" and importlib.util.find_spec("flash_attn") is None:
    raise RuntimeError("fla 0.6.0's Attention (fla/layers/attn.py) needs the flash_attn package, which is not "
                       "installed; its constructor raises ImportError without it")
  import fla.models
  config_name, model_name, _ = MODELS[model]
  config = getattr(fla.models, config_name)(**kwargs)
  torch.manual_seed(seed)
  network = getattr(fla.models, model_name)(config).to(device="cuda", dtype=torch.float32)
  network.train()
  return network, config


def _param_counts(network):
  embedding = network.get_input_embeddings().weight
  head = network.get_output_embeddings().weight
  tied = head is embedding
  total = sum(p.numel() for p in network.parameters())  # parameters() yields a tied weight once
  return {"total": total, "non_embedding": total - embedding.numel() - (0 if tied else head.numel()),
          "embedding": embedding.numel(), "lm_head": head.numel(), "head_tied": tied}


def _memory(torch):
  allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
  return {"max_allocated_bytes": allocated, "max_reserved_bytes": reserved,
          "max_allocated_gib": allocated / 2**30, "max_reserved_gib": reserved / 2**30}


def run(model, num_layers, width, num_heads, head_dim, mlp_hidden, vocab_size, batch, seq_len, steps, warmup,
        seed=0, out=None):
  """Builds the peer, runs `warmup` steps, then times `steps` steps synced (loss.item() every step; the
  median wall clock per step) and `steps` back to back (one synchronize at the end; total / steps).

  Returns the result dict (also written to `out`); failures land in result["error"], never raised.
  """
  start = time.perf_counter()
  tokens = batch * seq_len
  result = {
      "peer": "flash-linear-attention", "model": model,
      "shape": dict(num_layers=num_layers, width=width, num_heads=num_heads, head_dim=head_dim,
                    mlp_hidden=mlp_hidden, vocab_size=vocab_size, batch=batch, seq_len=seq_len),
      "tokens_per_step": tokens, "steps": steps, "warmup": warmup, "seed": seed,
      "precision": {"params": "float32", "compute": "bfloat16 via torch.autocast(device_type='cuda')",
                    "why": "flame (torchtitan) on one device: fp32 parameters, autocast for the forward"},
      "optimizer": {"name": "torch.optim.AdamW", "lr": LEARNING_RATE, "betas": list(BETAS),
                    "weight_decay": WEIGHT_DECAY, "fused": True, "clip_grad_norm": CLIP_NORM},
      "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"),
      "stage": "start", "error": None, "traceback": None,
  }

  def stage(name):
    result["stage"] = name
    result["error"] = f"the process ended during '{name}'"
    result["wall_s"] = time.perf_counter() - start
    _write(out, result)
    _log(start, name)

  try:
    stage("import")
    if steps < 1 or warmup < 0:
      raise ValueError(f"steps, warmup: expected steps >= 1 and warmup >= 0, got {steps} and {warmup}")
    config_name, kwargs = peer_kwargs(model, num_layers, width, num_heads, head_dim, mlp_hidden, vocab_size)
    result.update(config_class=config_name, model_class=MODELS[model][1], config_kwargs=kwargs)
    import torch
    result["versions"] = _versions()
    if not torch.cuda.is_available():
      raise RuntimeError("torch sees no CUDA device")
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    result["device"] = torch.cuda.get_device_name()
    result["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32

    stage(f"build {MODELS[model][1]}")
    network, config = _build(model, kwargs, seed)
    result["config"] = config.to_dict()
    result["params"] = _param_counts(network)
    result["param_dtypes"] = sorted({str(p.dtype) for p in network.parameters()})
    optimizer = torch.optim.AdamW(network.parameters(), lr=LEARNING_RATE, betas=BETAS,
                                  weight_decay=WEIGHT_DECAY, fused=True)
    generator = torch.Generator(device="cuda").manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (batch, seq_len), device="cuda", generator=generator)
    result["allocated_after_build_bytes"] = torch.cuda.memory_allocated()
    _log(start, f"{result['params']['total']:,} parameters ({result['params']['non_embedding']:,} "
                f"non-embedding), {result['param_dtypes']}")

    def train_step():
      with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        output = network(input_ids=input_ids, labels=input_ids, use_cache=False)
      output.loss.backward()
      torch.nn.utils.clip_grad_norm_(network.parameters(), CLIP_NORM)
      optimizer.step()
      optimizer.zero_grad(set_to_none=True)
      if "loss_fn" not in result:
        result["loss_fn"] = ("FusedLinearCrossEntropyLoss (head and loss fused, logits never materialised)"
                             if output.logits is None else
                             "FusedCrossEntropyLoss on the materialised [B*T, vocab] logits")
      return output.loss.detach()

    losses = []
    for i in range(warmup):
      stage(f"warm-up step {i + 1}/{warmup}" + (" (fla autotunes its kernels here; minutes)" if i == 0 else ""))
      step_start = time.perf_counter()
      losses.append(train_step().item())
      result.setdefault("warmup_step_s", []).append(time.perf_counter() - step_start)
      _log(start, f"warm-up step {i + 1}: loss {losses[-1]:.4f}, {result['warmup_step_s'][-1]:.2f} s")

    stage(f"timing {steps} steps synced (loss.item() every step)")
    step_ms = []
    for _ in range(steps):
      step_start = time.perf_counter()
      losses.append(train_step().item())
      step_ms.append((time.perf_counter() - step_start) * 1e3)
    synced_ms = statistics.median(step_ms)
    result["synced"] = {"ms_per_step": synced_ms, "tokens_per_s": tokens / synced_ms * 1e3,
                        "mean_ms": statistics.fmean(step_ms), "min_ms": min(step_ms), "step_ms": step_ms}
    _log(start, f"synced: {synced_ms:.2f} ms/step (median of {steps}), loss {losses[-1]:.4f}")

    stage(f"timing {steps} steps back to back (one synchronize at the end)")
    torch.cuda.synchronize()
    window_start = time.perf_counter()
    for _ in range(steps):
      loss = train_step()
    torch.cuda.synchronize()
    total_ms = (time.perf_counter() - window_start) * 1e3
    losses.append(loss.item())
    result["back_to_back"] = {"ms_per_step": total_ms / steps, "tokens_per_s": tokens * steps / total_ms * 1e3,
                              "total_ms": total_ms}
    _log(start, f"back to back: {total_ms / steps:.2f} ms/step")

    result["losses"] = {"first": losses[0], "last": losses[-1], "finite": all(map(math.isfinite, losses))}
    result["memory"] = _memory(torch)
    result["stage"], result["error"] = "done", None
  except Exception as error:  # every failure is a result: the caller times the other side regardless
    result["error"] = f"{type(error).__name__} during '{result['stage']}': {error}"
    result["traceback"] = traceback.format_exc()[-6000:]
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
      try:
        result["memory"] = _memory(sys.modules["torch"])
      except Exception:  # the CUDA context itself may be what failed
        pass
    _log(start, f"error: {result['error']}")
  result["wall_s"] = time.perf_counter() - start
  _write(out, result)
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="kda", help=f"one of {sorted(MODELS)}")
  for name, default in (("num_layers", 8), ("width", 2048), ("num_heads", 16), ("head_dim", 128),
                        ("mlp_hidden", 5632), ("vocab_size", 32000), ("batch", 4), ("seq_len", 4096),
                        ("steps", 20), ("warmup", 3), ("seed", 0)):
    parser.add_argument(f"--{name}", type=int, default=default)
  parser.add_argument("--out", default=None, help="the result JSON (rewritten at every stage)")
  args = parser.parse_args(argv)
  result = run(**vars(args))
  summary = {k: result.get(k) for k in ("model", "stage", "error", "synced", "back_to_back", "memory", "params")}
  if summary["synced"]:
    summary["synced"] = {k: v for k, v in summary["synced"].items() if k != "step_ms"}
  print(json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
  main()
