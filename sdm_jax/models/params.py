"""Parameter bookkeeping the trainer needs: the count and the weight-decay exclusions."""

import jax
import numpy as np
from flax import nnx

# A_log and dt_bias set the decay's time scales (DESIGN.md section 4); norm scales and biases are offsets.
NO_DECAY_NAMES = frozenset({"A_log", "dt_bias", "scale", "bias"})


def count_params(model):
  """The number of scalars in the model's nnx.Param leaves."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _leaf_name(path):
  names = [getattr(key, "key", getattr(key, "name", None)) for key in path]
  names = [n for n in names if isinstance(n, str) and n not in ("value", "raw_value")]
  return names[-1] if names else None


def no_decay_mask(params_state):
  """A pytree like params_state (an nnx.State or a pure dict) of bools: True for leaves weight decay must skip."""
  return jax.tree_util.tree_map_with_path(lambda path, _: _leaf_name(path) in NO_DECAY_NAMES, params_state)
