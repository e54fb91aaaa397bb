"""The 'cuda' lowering check of the kernel tests: lower a function for an abstract NVIDIA H200 (no GPU needed), which
catches primitives that interpret mode accepts but Triton does not; the Triton IR of the launches lowered, which
benchmarks/kernel_registers.py and benchmarks/ops/kernel_floors.py read; and every equation of a traced program
(`equations`), Pallas launches and kernel bodies included, for tests that read what a launch receives."""

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


def equations(jaxpr):
  """Every equation of a jaxpr (or ClosedJaxpr) and of the jaxprs inside it (kernel bodies, loops, calls), depth
  first. A Pallas launch is an equation of primitive "pallas_call" whose params["name"] is the launch's name."""
  for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from equations(inner)
