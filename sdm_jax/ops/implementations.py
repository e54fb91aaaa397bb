"""The implementation layer of an op family (DESIGN.md section 5): an ordered registry `{name: implementation}`.

impl="auto" runs the first implementation supported on jax's default backend; any other name runs the implementation
of that name on whatever backend (impl="pallas" in interpret mode off a GPU). The registry is the list of names
`impl` accepts. The dense delta rule's registry is `delta_rule.IMPLEMENTATIONS`.
"""

from typing import Any, Protocol

import jax

from sdm_jax.ops.validation import AUTO


class Implementation(Protocol):
  """One way to run an op. name: its `impl` name; config: a frozen dataclass holding its measured defaults (chunk
  size, launch settings), which a call that is not told them runs with; supported(backend): whether impl="auto" may
  pick it on `backend` (a `jax.default_backend()` name: "cpu", "gpu", "tpu")."""
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
