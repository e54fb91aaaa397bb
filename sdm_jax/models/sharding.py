"""One data-parallel mesh over every device of every host; parameters replicated or FSDP-sharded."""

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA = "data"


def make_mesh():
  return Mesh(np.asarray(jax.devices()), (DATA,))


def _param_spec(x, mesh, fsdp):
  # FSDP shards the largest dimension that divides evenly; everything else is replicated.
  n = mesh.shape[DATA]
  if fsdp and getattr(x, "ndim", 0) >= 1:
    dims = sorted(range(x.ndim), key=lambda d: -x.shape[d])
    for d in dims:
      if x.shape[d] % n == 0 and x.shape[d] >= n:
        spec = [None] * x.ndim
        spec[d] = DATA
        return NamedSharding(mesh, P(*spec))
  return NamedSharding(mesh, P())


def place_state(module, mesh, fsdp=False):
  """Puts a module's (or optimizer's) state on the mesh, replicated or FSDP-sharded."""
  state = nnx.state(module)
  shardings = jax.tree.map(lambda x: _param_spec(x, mesh, fsdp), state)
  nnx.update(module, jax.device_put(state, shardings))


def global_batch(local_batch, mesh):
  """Assembles each host's slice of the batch into one array sharded over the data axis."""
  sharding = NamedSharding(mesh, P(DATA))
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local_batch.items()}
