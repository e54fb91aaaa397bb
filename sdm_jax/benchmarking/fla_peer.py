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

Both take safe_gate=True with lower_bound (fla's recommended -5): a lower bound on the per-step log decay that lets
their intra-chunk products run on tensor cores. fla requires g >= lower_bound of the caller; the op benchmark clips
every input set's g there, for ours and the peer's alike (`lower_bound`), so both compute the same.
"""

import functools
import importlib

import numpy as np

from sdm_jax.benchmarking.timing import back_to_back_ms, kernel_summary, median_ms

PEER_OPS = {"kda": ("fla.ops.kda", "chunk_kda"), "gdn2": ("fla.ops.gdn2", "chunk_gdn2")}
# The peer's modes, each its op's keyword arguments: "plain" as the op comes; "safe_gate" the bounded-decay mode.
PEER_MODES = {"plain": {}, "safe_gate": {"safe_gate": True, "lower_bound": -5.0}}


def check_modes(modes):
  """ValueError naming peer_modes unless `modes` are some of PEER_MODES."""
  unknown = [m for m in modes if m not in PEER_MODES]
  if unknown or not modes:
    raise ValueError(f"peer_modes: expected some of {tuple(PEER_MODES)}, got {list(modes)}")


def lower_bound(modes):
  """The lowest log decay every mode in `modes` accepts (the largest of their lower bounds), or None."""
  bounds = [PEER_MODES[m]["lower_bound"] for m in modes if "lower_bound" in PEER_MODES[m]]
  return max(bounds) if bounds else None


def peer_name(mode):
  """The impl name of the peer's records in `mode`: "fla", or "fla <mode>"."""
  return "fla" if mode == "plain" else f"fla {mode}"


def unavailable():
  """Why no torch peer can run here ("torch is not installed", "torch sees no CUDA device"), or None."""
  try:
    import torch
  except ImportError:
    return "torch is not installed"
  if not torch.cuda.is_available():
    return "torch sees no CUDA device"
  return None


def load_peer(mixer, mode="plain"):
  """Returns (op, description), op in `mode` (PEER_MODES: its keyword arguments bound), or (None, why there is no
  peer for `mixer` here)."""
  check_modes([mode])
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
  options = "".join(f", {key}={value}" for key, value in PEER_MODES[mode].items())
  return functools.partial(op, **PEER_MODES[mode]), f"{module_name}.{name}({options.lstrip(', ')}) ({versions})"


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
