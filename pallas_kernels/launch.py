"""What every Pallas launch of this package shares: the `Shape` a launch rule reads, the `LaunchSettings` protocol
that each kernel's settings class implements, and `named_call`, a `pl.pallas_call` on named operands and results
whose in-place results are named too (its input_output_aliases computed from the names).

Every kernel module lists its settings classes in `SETTINGS`. A settings class is frozen and hashable (the launching
function takes it as a static argument) and says two things: what the kernel runs with when not told
(`defaults(shape)`, the rule beside the measurement it came from) and which launches are worth timing at a shape
(`candidates(shape)`, the defaults first), which the `kernels` benchmark mode sweeps
(`sdm_jax.benchmarking.kernel_bench.KERNELS`). tests/pallas_kernels/test_launch_settings.py holds every kernel
module to this.
"""

import dataclasses
import inspect
from typing import NamedTuple, Optional, Protocol, runtime_checkable

from jax.experimental import pallas as pl


class Shape(NamedTuple):
  """The sizes a launch rule may read, in DESIGN.md's names: B batch, T tokens, H heads, K and V the key and value
  widths of a head, dtype the name of the io dtype ("bfloat16"); chunk_size the dense chunk kernels' C; N the Sparse
  Delta Memory's slots per head and W the slots a token writes (and reads: R = W), for product-key addressing
  n = sqrt(N) sub-keys per half and k = W. A rule reads the sizes it needs (`require`); the others may be None."""
  B: Optional[int] = None
  T: Optional[int] = None
  H: Optional[int] = None
  K: Optional[int] = None
  V: Optional[int] = None
  dtype: Optional[str] = None
  chunk_size: Optional[int] = None
  N: Optional[int] = None
  W: Optional[int] = None


def require(shape, owner, *names):
  """The sizes `names` of shape, in that order; ValueError naming the first one missing (owner: whose rule reads
  them)."""
  for name in names:
    if shape is None or getattr(shape, name) is None:
      raise ValueError(f"shape.{name}: {owner}'s rule reads it, got {shape!r}")
  return tuple(getattr(shape, name) for name in names)


@runtime_checkable
class LaunchSettings(Protocol):
  """A kernel's launch settings: a frozen class (a dataclass or a NamedTuple) whose fields the launch is built
  from."""

  @classmethod
  def defaults(cls, shape=None):
    """The settings the kernel runs with when not told, at shape (a `Shape`; None where the rule reads no size)."""

  @classmethod
  def candidates(cls, shape=None):
    """The launches worth timing at shape, a tuple of settings without repeats: `defaults(shape)` first."""


def field_names(cls):
  """The fields of a settings class, in order."""
  return cls._fields if issubclass(cls, tuple) else tuple(f.name for f in dataclasses.fields(cls))


def replace(settings, **fields):
  """settings with fields replaced (a dataclass or a NamedTuple)."""
  return settings._replace(**fields) if isinstance(settings, tuple) else dataclasses.replace(settings, **fields)


def settings_at(cls, shape, **fields):
  """cls's settings at shape with fields set. A field its rule also takes as a keyword argument of `defaults` (the
  state passes' block_v and num_stages) goes through the rule, so that the fields derived from it follow; the others
  replace the defaults' values."""
  rule_inputs = inspect.signature(cls.defaults).parameters
  rule = {name: fields.pop(name) for name in list(fields) if name in rule_inputs}
  return replace(cls.defaults(shape, **rule), **fields)


def one_at_a_time(cls, shape, **alternatives):
  """The defaults at shape, then the defaults with one field set to each of its alternative values (through
  `settings_at`), without repeats: a sweep around the measured rule rather than the product of every field."""
  out = [cls.defaults(shape)]
  for name, values in alternatives.items():
    for value in values:
      settings = settings_at(cls, shape, **{name: value})
      if settings not in out:
        out.append(settings)
  return tuple(out)


def named_call(kernel, operands, results, *, in_place=(), **launch):
  """`pl.pallas_call(kernel, **launch)` on operands {name: (array, BlockSpec)} giving results {name:
  (jax.ShapeDtypeStruct, BlockSpec)}, the kernel's refs in those orders. in_place: names of both an operand and a
  result, the result written where the operand is (input_output_aliases). Returns the results, a tuple in order."""
  inputs, outputs = tuple(operands), tuple(results)
  return pl.pallas_call(kernel, out_shape=tuple(shape for shape, _ in results.values()),
                        in_specs=[spec for _, spec in operands.values()],
                        out_specs=tuple(spec for _, spec in results.values()),
                        input_output_aliases={inputs.index(name): outputs.index(name) for name in in_place},
                        **launch)(*(array for array, _ in operands.values()))
