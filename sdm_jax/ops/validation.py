"""Input checks shared by every op: shapes, dtypes and options, with messages that say what was expected."""

import jax.numpy as jnp

IMPLS = ("scan", "chunk", "pallas")


def _fmt(names, dims):
  return "[" + ", ".join(names) + "] = (" + ", ".join(str(dims.get(n, "?")) for n in names) + ")"


def check_float(name, x):
  if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
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


def check_options(impl, chunk_size):
  if impl not in IMPLS:
    raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
  if not isinstance(chunk_size, int) or chunk_size < 1 or chunk_size & (chunk_size - 1):
    raise ValueError(f"chunk_size: expected a power of two (16, 32, 64, 128), got {chunk_size!r}")
