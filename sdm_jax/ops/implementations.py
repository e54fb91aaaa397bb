"""The implementation layer of an op family (DESIGN.md section 5): an ordered registry `{name: implementation}`.

impl="auto" runs the first implementation supported on jax's default backend; any other name runs the implementation
of that name on whatever backend (impl="pallas" in interpret mode off a GPU). The registry is the list of names
`impl` accepts. The registries: `delta_rule.IMPLEMENTATIONS` (the dense delta rule), `sparse_delta.IMPLEMENTATIONS`
(Sparse Delta Memory), `product_key.IMPLEMENTATIONS` (product-key addressing).
"""

import dataclasses
from typing import Any, Protocol

import jax

from sdm_jax.ops.validation import AUTO


class Implementation(Protocol):
  """One way to run an op, a frozen dataclass. name: its `impl` name; config: a frozen dataclass holding its options
  with their measured defaults (chunk size, launch settings), which a call that is not told them runs with, and
  checking itself (ValueError naming the field); supported(backend): whether impl="auto" may pick it on `backend` (a
  `jax.default_backend()` name: "cpu", "gpu", "tpu")."""
  name: str
  config: Any

  def supported(self, backend: str) -> bool:
    ...


def pick(impl, implementations):
  """The implementation of `impl` in `implementations` ({name: implementation}, in "auto"'s order of preference):
  for "auto" the first supported on jax's default backend, checked at trace time. ValueError naming impl for a name
  the registry lacks, listing the names it has."""
  if impl == AUTO:
    backend = jax.default_backend()
    for implementation in implementations.values():
      if implementation.supported(backend):
        return implementation
    raise ValueError(f"impl: 'auto' found none of {tuple(implementations)} supported on backend {backend!r}; "
                     f"name one")
  if not isinstance(impl, str) or impl not in implementations:
    raise ValueError(f"impl: expected one of {(AUTO, *implementations)}, got {impl!r}")
  return implementations[impl]


def configure(impl, implementations, options):
  """The implementation of `impl` (`pick`) with `options` ({name: value}, an op's keyword options) set in its config.

  Each option is a field of one or more implementations' configs and is checked by every config that has it,
  whatever impl runs, so a bad value fails on every backend. An option at its default there (as the config holds it:
  dtypes by name, None launch settings as the defaults) is what every implementation runs, so any takes it. One set
  otherwise belongs to the implementations whose config has it: a named impl whose config lacks it refuses it
  (ValueError naming the options and their implementations); "auto" runs the implementation it picks without it."""
  implementation = pick(impl, implementations)
  owners, changed = {name: [] for name in options}, {}
  for owner in implementations.values():
    fields = {field.name for field in dataclasses.fields(owner.config)} & options.keys()
    config = dataclasses.replace(owner.config, **{name: options[name] for name in fields})
    for name in fields:
      owners[name].append(owner.name)
      if getattr(config, name) != getattr(owner.config, name):
        changed[name] = owners[name]
  if unknown := [name for name, names in owners.items() if not names]:
    raise ValueError(f"{', '.join(unknown)}: no config of {tuple(implementations)} has this option")
  own = {field.name for field in dataclasses.fields(implementation.config)}
  if impl != AUTO and (refused := [name for name in changed if name not in own]):
    holders = " or ".join(repr(name) for name in dict.fromkeys(n for name in refused for n in owners[name]))
    kind = "an option" if len(refused) == 1 else "options"
    raise ValueError(f"{', '.join(refused)}: {kind} of impl={holders} (or 'auto' where it picks one), got "
                     f"impl={impl!r} with " + ", ".join(f"{name}={options[name]!r}" for name in refused))
  config = dataclasses.replace(implementation.config, **{name: options[name] for name in own & options.keys()})
  return dataclasses.replace(implementation, config=config)
