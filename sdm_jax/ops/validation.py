"""Input checks shared by every op: shapes, dtypes and options, with messages that say what was expected."""

import numbers

import jax
import jax.numpy as jnp
import numpy as np

AUTO = "auto"  # every op's default impl: the first of its registry supported on the backend (`implementations.pick`)


def on_gpu():
  """The one backend check: whether jax's default backend is a GPU."""
  return jax.default_backend() == "gpu"


def _fmt(names, dims):
  return "[" + ", ".join(names) + "] = (" + ", ".join(str(dims.get(n, "?")) for n in names) + ")"


def check_array(name, x):
  """ValueError naming the argument unless x is an array (a jax or NumPy array; a Python list is not)."""
  if not isinstance(x, (jax.Array, np.ndarray)):
    raise ValueError(f"{name}: expected an array (jax.Array or numpy.ndarray), got {type(x).__name__}")


def check_float(name, x):
  check_array(name, x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{name}: expected a floating dtype (float32, bfloat16, float16, float64), got {x.dtype}")


def check_shape(name, x, names, dims):
  """Checks `x` against the dimension names `names`, binding unknown names into `dims`."""
  check_float(name, x)
  shape = tuple(x.shape)
  if len(shape) != len(names):
    raise ValueError(f"{name}: expected rank {len(names)} with shape {_fmt(names, dims)}, got shape {shape}")
  for n, size in zip(names, shape):
    if n in dims and dims[n] != size:
      raise ValueError(f"{name}: expected shape {_fmt(names, dims)}, got {shape} (dimension {n} is {size}, expected {dims[n]})")
    dims.setdefault(n, size)


def check_chunk_size(chunk_size, *, rule=False):
  """ValueError naming chunk_size unless it is an integer power of two (not a bool, a float or a string), or None
  where the op has a rule for it (rule=True)."""
  if chunk_size is None and rule:
    return
  if (isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or chunk_size < 1
      or int(chunk_size) & (int(chunk_size) - 1)):
    expected = "None (the impl's rule) or a power of two" if rule else "a power of two"
    raise ValueError(f"chunk_size: expected {expected} (16, 32, 64, 128), got {chunk_size!r}")


def check_scale(scale):
  """ValueError unless scale is None (the op's default) or a real number (a Python or NumPy number, or a scalar
  array: a traced one too)."""
  if scale is None or (isinstance(scale, numbers.Real) and not isinstance(scale, bool)):
    return
  if isinstance(scale, (jax.Array, np.ndarray)) and scale.ndim == 0 and (
      jnp.issubdtype(scale.dtype, jnp.floating) or jnp.issubdtype(scale.dtype, jnp.integer)):
    return
  raise ValueError(f"scale: expected None or a real number, got {scale!r}")


def chunk_size_for(chunk_size, T):
  """chunk_size, or the padded length when it is smaller: the smallest power of two >= T, at least 16 (the chunked
  form's sub-chunk), so that a chunk never holds more padding than tokens and memory stays O(T). The chunked
  results do not depend on the chunk size. (impl="pallas" takes only 16, 32, 64 and is not clamped: its sizes are
  bounded already and a size it lacks is refused whatever T.)"""
  return min(int(chunk_size), max(16, 1 << max(T - 1, 0).bit_length()))


def empty_outputs(dims, o_dtype, state_dtype, initial_state):
  """The result of a dense op with a dimension of size 0 (an empty batch, sequence, head count, key or value
  width), or None when every dimension is positive: (o zeros [B, T, H, V] in o_dtype, the initial state [B, H, K,
  V], zeros if None, in state_dtype). With T = 0 nothing changes the state; with another empty dimension o and the
  state hold no entries or, for K = 0, o has nothing to read."""
  if 0 not in dims.values():
    return None
  B, T, H, K, V = (dims[n] for n in "BTHKV")
  state = jnp.zeros((B, H, K, V), state_dtype) if initial_state is None else initial_state.astype(state_dtype)
  return jnp.zeros((B, T, H, V), o_dtype), state
