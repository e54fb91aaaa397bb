"""flash-linear-attention's Triton kernels (fla-core 0.6.0) as the peer, imported only when asked for.

In fla-core 0.6.0:
  fla.ops.kda.chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, ..., **kwargs)   (chunk_size=32 or 64 via kwargs)
  fla.ops.gdn2.chunk_gdn2(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False,
                          use_qk_l2norm_in_kernel=False, ..., **kwargs)  (chunk_size must be 64)
Both use our layout ([B, T, H, K] for q, k, g, b; [B, T, H, V] for v, w; beta [B, T, H]), take g
as the natural-log decay (with use_gate_in_kernel=False, the default), scale K**-0.5 by default
and an fp32 initial state, so our inputs go over unchanged; use_qk_l2norm_in_kernel=True matches
use_qk_l2norm=True. fla's chunk_gated_delta_rule is left out (DESIGN.md section 7).
"""

import importlib

import numpy as np

from sdm_jax.benchmarking.timing import back_to_back_ms, kernel_summary, median_ms

PEER_OPS = {"kda": ("fla.ops.kda", "chunk_kda"), "gdn2": ("fla.ops.gdn2", "chunk_gdn2")}


def unavailable():
  """Why no torch peer can run here ("torch is not installed", "torch sees no CUDA device"), or None."""
  try:
    import torch
  except ImportError:
    return "torch is not installed"
  if not torch.cuda.is_available():
    return "torch sees no CUDA device"
  return None


def load_peer(mixer):
  """Returns (op, description), or (None, why there is no peer for `mixer` here)."""
  if mixer not in PEER_OPS:
    return None, f"no fla peer for {mixer}"
  reason = unavailable()
  if reason:
    return None, reason
  import torch
  module_name, name = PEER_OPS[mixer]
  try:
    op = getattr(importlib.import_module(module_name), name)
    import fla
    import triton
  except Exception as error:  # an old or broken fla fails in many ways; report it and go on
    return None, f"cannot import {module_name}.{name}: {type(error).__name__}: {error}"
  versions = f"fla {getattr(fla, '__version__', '?')}, torch {torch.__version__}, triton {triton.__version__}"
  return op, f"{module_name}.{name} ({versions})"


def _to_torch(x, requires_grad=False):
  import torch
  x = np.asarray(x)
  if x.dtype.name == "bfloat16":  # numpy has no bf16 of its own; the fp32 round trip is exact
    tensor = torch.from_numpy(x.astype(np.float32)).cuda().to(torch.bfloat16)
  else:
    tensor = torch.from_numpy(np.ascontiguousarray(x)).cuda()
  return tensor.requires_grad_(requires_grad)


def peer_calls(op, arg_sets, readout):
  """The peer on torch copies of arg_sets (dicts of arrays in the op's argument order: q, k, v, g, gates):
  (sets of tensors, forward(*xs) -> o, forward_backward(*xs) -> the vjp with cotangent `readout` [B, T, H, V]
  w.r.t. every input, sync)."""
  import torch
  sets = [[_to_torch(x, requires_grad=True) for x in args.values()] for args in arg_sets]
  cotangent = _to_torch(readout).to(sets[0][2].dtype)

  def forward(*xs):
    with torch.no_grad():
      return op(*xs, use_qk_l2norm_in_kernel=True)[0]

  def forward_backward(*xs):
    o, _ = op(*xs, use_qk_l2norm_in_kernel=True)
    return torch.autograd.grad(o, xs, grad_outputs=cotangent)

  return sets, forward, forward_backward, lambda _: torch.cuda.synchronize()


def time_peer(op, arg_sets, readout, reps, breakdown=False):
  """Times op's forward and forward+backward (`peer_calls`).

  Returns ({"fwd_ms", "fwd_bwd_ms", "fwd_host_ms", "fwd_bwd_host_ms" (back to back), and with breakdown
  "kernels_fwd", "kernels_fwd_bwd": `timing.kernel_summary` of one more run of each}, o of the first set as
  np.float32).
  """
  import torch
  sets, forward, forward_backward, sync = peer_calls(op, arg_sets, readout)
  timings = {"fwd_ms": median_ms(forward, sets, reps, sync),
             "fwd_bwd_ms": median_ms(forward_backward, sets, reps, sync),
             "fwd_host_ms": back_to_back_ms(forward, sets, reps, sync),
             "fwd_bwd_host_ms": back_to_back_ms(forward_backward, sets, reps, sync)}
  if breakdown:
    for part, fn in (("fwd", forward), ("fwd_bwd", forward_backward)):
      timings[f"kernels_{part}"] = kernel_summary(lambda fn=fn: sync(fn(*sets[0])), top=30)
  o = forward(*sets[0]).float().cpu().numpy()
  del sets
  torch.cuda.empty_cache()  # JAX shares this GPU
  return timings, o
