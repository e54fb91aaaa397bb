"""The one list of dense mixers: `MIXERS`, iterated by the ops, the layer, the input generators, the configs,
the benchmarks and the tests, so that a mixer registered here is everywhere at once.

A mixer is what DESIGN.md section 1 says tells it apart under the generalized rule: a build (k, v, *gates) -> (u, e, z),
the shape of its log decay, its gates, and a constraint on K and V if it has one. Its public op (`Mixer.op`) is made
from the entry. The five of the papers are registered in `sdm_jax.ops.mixers`; README "Contributing: adding a
mixer" says how to add one.
"""

import dataclasses
import inspect
from typing import Callable

from sdm_jax.ops.delta_rule import GATE_KINDS, run_mixer
from sdm_jax.ops.validation import check_array

# The keyword options of every op, with their defaults (DESIGN.md section 5).
OPTIONS = {"scale": None, "initial_state": None, "output_final_state": False, "use_qk_l2norm": False,
           "impl": "auto", "chunk_size": None, "segment_ids": None, "lower_bound": None}


@dataclasses.dataclass(frozen=True)
class Mixer:
  """One dense mixer.

  name: the paper's short name, as the layer, configs and tests spell it ("gdn2").
  op_name: the name of its public op in `sdm_jax.ops` ("gdn2"); `op` is that function, made from this entry.
  build: (k, v, *gates) -> (u, e, z). A module-level function, so it is the same object on every call:
    impl="pallas" hands it to jitted kernels as a static argument, and their compilations are then reused.
  decay: the log decay g, "head" ([B, T, H], a scalar per head) or "key" ([B, T, H, K]).
  gates: ((op argument, "head" | "key" | "value"), ...), the gates after g in the op's argument order; "head" is
    [B, T, H], "key" [B, T, H, K], "value" [B, T, H, V].
  doc: the op's docstring.
  equal_dims: None, or why the mixer needs K == V; then the op and the layer reject K != V with that reason.
  writes_vanish_with_k: the build's u and e are zero wherever k is (each a product with k, as in every mixer of
    the papers): a padding token with zero k then writes and erases nothing, so impl="pallas" zeroes only q and k
    on padding, in its forward kernels (`segments.kernel_masks`), instead of every input by XLA.
    tests/ops/test_packed.py checks the claim for every registered mixer; False (the default) masks every input.
  """
  name: str
  op_name: str
  build: Callable
  decay: str
  gates: tuple
  doc: str = dataclasses.field(default="", repr=False)
  equal_dims: str | None = None
  writes_vanish_with_k: bool = False
  op: Callable = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    if self.decay not in ("head", "key"):
      raise ValueError(f"decay: expected 'head' or 'key', got {self.decay!r}")
    for gate in self.gates:
      if len(gate) != 2 or gate[1] not in GATE_KINDS:
        raise ValueError(f"gates: expected (name, one of {tuple(GATE_KINDS)}) pairs, got {gate!r}")
    object.__setattr__(self, "op", _make_op(self))

  @property
  def arguments(self):
    """The op's array arguments in order: q, k, v, g and the gates."""
    return ("q", "k", "v", "g") + tuple(name for name, _ in self.gates)

  def value_dim(self, K, V):
    """The value width that goes with key width K: V, or K where the mixer needs K == V."""
    return V if self.equal_dims is None else K

  def check_dims(self, argument, K, V):
    """Raises ValueError naming `argument` when the mixer needs K == V and they differ."""
    if self.equal_dims is not None and K != V:
      raise ValueError(f"{argument}: {self.name} requires K == V ({self.equal_dims}), got K={K}, V={V}")


def _make_op(mixer):
  """The public op of `mixer`: (q, k, v, g, *gates, **OPTIONS) -> (o, final state or None)."""
  positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
  signature = inspect.Signature(
      [inspect.Parameter(name, positional) for name in mixer.arguments]
      + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=value) for name, value in OPTIONS.items()])

  def op(*args, **kwargs):
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    given = bound.arguments
    q, k, v, g = (given[name] for name in ("q", "k", "v", "g"))
    for name in mixer.arguments:  # before anything reads their shapes
      check_array(name, given[name])
    if mixer.equal_dims is not None:  # k and v are read here before run_mixer checks their shapes
      mixer.check_dims("v", k.shape[-1], v.shape[-1])
    gates = {"g": (g, mixer.decay), **{name: (given[name], kind) for name, kind in mixer.gates}}
    return run_mixer(mixer.build, q, k, v, gates, writes_vanish_with_k=mixer.writes_vanish_with_k,
                     **{name: given[name] for name in OPTIONS})

  op.__name__ = op.__qualname__ = mixer.op_name
  op.__module__ = mixer.build.__module__
  op.__doc__ = mixer.doc
  op.__signature__ = signature
  return op


def gate_shapes(B, T, H, K, V):
  """{kind: shape} for the kinds of gates and decays: "head" (B, T, H), "key" (B, T, H, K), "value" (B, T, H, V)."""
  dims = {"B": B, "T": T, "H": H, "K": K, "V": V}
  return {kind: tuple(dims[n] for n in names) for kind, names in GATE_KINDS.items()}


MIXERS: dict[str, Mixer] = {}


def register(mixer):
  """Adds `mixer` to MIXERS and returns it; ValueError if its name or its op's name is taken."""
  for field, taken in (("name", MIXERS), ("op_name", {m.op_name for m in MIXERS.values()})):
    if getattr(mixer, field) in taken:
      raise ValueError(f"{field}: a mixer {getattr(mixer, field)!r} is already registered")
  MIXERS[mixer.name] = mixer
  return mixer
