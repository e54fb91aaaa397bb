"""The 'cuda' lowering check of the kernel tests and benchmarks/kernel_registers.py: lower a function for an
abstract NVIDIA H200 (no GPU needed), which catches primitives that interpret mode accepts but Triton does not."""

import jax

TRITON_CALL = "__gpu$xla.gpu.triton"  # one per Pallas launch in the lowered text


def lower_for_h200(fn, *args):
  """The StableHLO text of jax.jit(fn) lowered to 'cuda' for abstract args (ShapeDtypeStructs)."""
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
