"""Input checks shared by every op: shapes, dtypes and options, with messages that say what was expected."""

import jax
import jax.numpy as jnp

IMPLS = ("scan", "chunk", "pallas")
AUTO = "auto"  # every op's default: "pallas" on a GPU, its XLA impl elsewhere (see resolve_impl)


def on_gpu():
  """The one backend check: whether jax's default backend is a GPU."""
  return jax.default_backend() == "gpu"


def resolve_impl(impl, impls=IMPLS, fallback="chunk"):
  """The impl that runs: "auto" becomes "pallas" on a GPU and `fallback` elsewhere; any other name must be in
  `impls` (ValueError otherwise). Called once per op, at trace time."""
  if impl == AUTO:
    return "pallas" if on_gpu() else fallback
  if impl not in impls:
    raise ValueError(f"impl: expected one of {(AUTO, *impls)}, got {impl!r}")
  return impl


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
  """Checks the options of a recurrence op; returns the impl that runs (`resolve_impl`)."""
  impl = resolve_impl(impl)
  if not isinstance(chunk_size, int) or chunk_size < 1 or chunk_size & (chunk_size - 1):
    raise ValueError(f"chunk_size: expected a power of two (16, 32, 64, 128), got {chunk_size!r}")
  return impl
