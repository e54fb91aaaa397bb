"""The 'cuda' lowering check of the kernel tests: lower a function for an abstract NVIDIA H200 (no GPU needed), which
catches primitives that interpret mode accepts but Triton does not; and the Triton IR of the launches lowered, which
benchmarks/kernel_registers.py and benchmarks/ops/kernel_floors.py read."""

import contextlib

import jax

TRITON_CALL = "__gpu$xla.gpu.triton"  # one per Pallas launch in the lowered text


def lower_for_h200(fn, *args):
  """The StableHLO text of jax.jit(fn) lowered to 'cuda' for abstract args (ShapeDtypeStructs)."""
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@contextlib.contextmanager
def triton_ir():
  """Collects the Triton IR text of every Pallas launch lowered inside the block, in lowering order, into the list
  it yields (a launch lowers once per lowering of its caller)."""
  from jax._src.pallas.triton import pallas_call_registration as registration
  texts, lower = [], registration.lowering.lower_jaxpr_to_triton_module

  def capture(*args, **kwargs):
    result = lower(*args, **kwargs)
    texts.append(result.module.operation.get_asm(enable_debug_info=False))
    return result

  registration.lowering.lower_jaxpr_to_triton_module = capture
  try:
    yield texts
  finally:
    registration.lowering.lower_jaxpr_to_triton_module = lower
