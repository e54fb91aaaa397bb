"""Launch settings. Every kernel module's settings classes implement `pallas_kernels.launch.LaunchSettings`
(defaults for a shape, candidates to sweep), and each kernel's default rule gives, at the shapes the benchmarks time
(GDN-2 / KDA at B 4, T 4096, H 16, K = V = 128, chunk 32 and 64, on the H200), the values measured fastest in the
records the rules cite, so that changing a rule is a visible decision."""

import dataclasses
import importlib
import pathlib
import re

import jax.numpy as jnp
import pytest

from pallas_kernels.delta_rule_bwd import IntraChunkBwdSettings, StatePassBwdSettings
from pallas_kernels.delta_rule_fwd import (SHARED_MEMORY, SHARED_MEMORY_DEFAULT, ChunkCumsumSettings,
                                           IntraChunkSettings, StatePassSettings)
from pallas_kernels.launch import LaunchSettings, Shape, field_names, settings_at
from pallas_kernels.mixer_inputs import MixerInputsSettings
from pallas_kernels.product_key import ProductKeySettings, num_rank_pairs
from pallas_kernels.sparse_tokens import DEFAULT_LAUNCH, Launch
from sdm_jax.ops.pallas import PallasOpSettings
from sdm_jax.ops.product_key import rank_pairs

B, T, H, K, V = 4, 4096, 16, 128, 128
H200 = SHARED_MEMORY["9.0"]
PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "pallas_kernels"
# A kernel module launches through pl.pallas_call or launch.named_call (launch.py, which defines it, launches none).
KERNEL_MODULES = sorted(path.stem for path in PACKAGE.glob("*.py")
                        if path.stem != "launch" and re.search(r"\b(pallas_call|named_call)\(", path.read_text()))
# A shape every rule can read.
SAMPLE = Shape(B=2, T=64, H=2, K=64, V=64, dtype="bfloat16", chunk_size=32, N=1024, W=16)


def protocol_problems(cls, shape=SAMPLE):
  """What keeps cls from being a kernel's launch settings (`launch.LaunchSettings`): [] when nothing does."""
  if not isinstance(cls, LaunchSettings):
    return [f"{cls.__name__}: no defaults or no candidates classmethod"]
  defaults, candidates = cls.defaults(shape), cls.candidates(shape)
  problems = []
  if type(defaults) is not cls or hash(defaults) != hash(cls.defaults(shape)):
    problems.append(f"{cls.__name__}.defaults: expected a hashable {cls.__name__}, got {defaults!r}")
  if not isinstance(candidates, tuple) or not candidates or candidates[0] != defaults:
    problems.append(f"{cls.__name__}.candidates: expected a tuple starting with the defaults, got {candidates!r}")
  elif len(set(candidates)) != len(candidates) or any(type(c) is not cls for c in candidates):
    problems.append(f"{cls.__name__}.candidates: expected distinct {cls.__name__}s, got {candidates!r}")
  return problems


def test_every_kernel_modules_settings_implement_the_protocol():
  assert KERNEL_MODULES == ["delta_rule_bwd", "delta_rule_fwd", "mixer_inputs", "product_key", "sparse_tokens"]
  for name in KERNEL_MODULES:
    module = importlib.import_module(f"pallas_kernels.{name}")
    listed = getattr(module, "SETTINGS", ())
    assert listed, f"pallas_kernels.{name}: expected SETTINGS, its launch settings classes"
    defined = {cls for cls in vars(module).values()
               if isinstance(cls, type) and cls.__module__ == module.__name__ and cls.__name__.endswith("Settings")}
    assert defined <= set(listed), f"pallas_kernels.{name}: settings missing from SETTINGS: {defined - set(listed)}"
    for cls in listed:
      assert protocol_problems(cls) == [], name
  assert protocol_problems(PallasOpSettings) == []  # the op's own setting, the chunk size, follows it too


def test_the_protocol_check_names_what_is_missing():
  @dataclasses.dataclass(frozen=True)
  class NoCandidatesSettings:
    num_warps: int = 4

    @classmethod
    def defaults(cls, shape=None):
      return cls()

  @dataclasses.dataclass(frozen=True)
  class RepeatingSettings(NoCandidatesSettings):
    @classmethod
    def candidates(cls, shape=None):
      return cls(), cls(num_warps=8), cls(num_warps=8)

  assert protocol_problems(NoCandidatesSettings) == ["NoCandidatesSettings: no defaults or no candidates classmethod"]
  assert "expected distinct RepeatingSettings" in protocol_problems(RepeatingSettings)[0]


def test_a_rule_names_the_size_it_needs():
  with pytest.raises(ValueError, match=r"shape.chunk_size: IntraChunkSettings's rule reads it"):
    IntraChunkSettings.defaults(Shape(B=1))
  with pytest.raises(ValueError, match=r"shape.N: ProductKeySettings's rule reads it"):
    ProductKeySettings.defaults(None)


@pytest.mark.parametrize("chunk_size,warps,key_block,value_block,sub_block", [(32, 2, 16, 64, 2), (64, 4, 32, 32, 4)])
def test_per_chunk_kernels(chunk_size, warps, key_block, value_block, sub_block):
  shape = Shape(B, T, H, K, V, "bfloat16", chunk_size)
  assert IntraChunkSettings.defaults(shape) == IntraChunkSettings(
      key_block=32, sub_block=sub_block, num_warps=warps, solve_key_block=64, solve_value_block=64, solve_warps=4,
      num_stages=1, solve_stages=2, bounded_stages=2)
  assert IntraChunkBwdSettings.defaults(shape) == IntraChunkBwdSettings(
      key_block=key_block, value_block=value_block, num_warps=warps, num_stages=2, pair_key_block=32,
      pair_warps=warps, sub_block=4, bounded_pairs=False)


@pytest.mark.parametrize("chunk_size,dtype,stages", [
    (32, jnp.bfloat16, 3), (64, jnp.bfloat16, 3), (32, jnp.float32, 3), (64, jnp.float32, 1)])
def test_state_passes(chunk_size, dtype, stages):
  shape = Shape(B, T, H, K, V, jnp.dtype(dtype).name, chunk_size)
  for cls in (StatePassSettings, StatePassBwdSettings):
    want = cls(block_v=64, num_warps=4, num_stages=stages)
    assert cls.defaults(shape, shared_memory=H200) == want


@pytest.mark.parametrize("batch,block_v", [(8, 64), (4, 64), (2, 32), (1, 16)])
def test_state_block_v_at_the_measured_batches(batch, block_v):
  """The measured picks at B x T = 32,768 tokens, H 16 (benchmarks/ops/README.md, launch settings)."""
  shape = Shape(batch, 32768 // batch, H, K, V, "bfloat16", 32)
  assert StatePassSettings.defaults(shape, shared_memory=H200).block_v == block_v


def test_a_swept_field_the_rule_reads_goes_through_it():
  """block_v set from a grid or a candidate: the stages follow it as the rule's do (on a GPU of 101,376 bytes a
  program: 3 stages fit block_v 16, 2 fit 64); a field the rule does not read replaces the default's."""
  shape = Shape(4, 256, H, K, V, "bfloat16", 32)
  stages = lambda block_v: settings_at(StatePassSettings, shape, block_v=block_v,
                                       shared_memory=SHARED_MEMORY_DEFAULT).num_stages
  assert (stages(16), stages(64)) == (3, 2)
  assert settings_at(StatePassSettings, shape, num_warps=8).num_warps == 8
  assert {s.block_v for s in StatePassSettings.candidates(shape)} == {16, 32, 64}
  assert settings_at(IntraChunkSettings, shape, key_block=16) == dataclasses.replace(
      IntraChunkSettings.defaults(shape), key_block=16)


def test_memory_bound_launches_addressing_and_token_kernels():
  assert ChunkCumsumSettings.defaults() == ChunkCumsumSettings(num_warps=4)
  assert MixerInputsSettings.defaults() == MixerInputsSettings(rows=32, num_warps=4)
  # The addressing bench: n = 256 sub-keys per half, k = 128 (benchmarks/ops/README.md, launch settings).
  assert ProductKeySettings.defaults(Shape(N=256 * 256, W=128)) == ProductKeySettings(block_rows=16, block_cols=128,
                                                                                       num_warps=16)
  # The token kernels' launch at the bench shape (benchmarks/sdm/README.md, launch settings).
  assert Launch.defaults() == DEFAULT_LAUNCH == Launch(block_v=64, num_warps=8)
  assert PallasOpSettings.defaults() == PallasOpSettings(chunk_size=32)
  assert [s.chunk_size for s in PallasOpSettings.candidates()] == [32, 16, 64]


@pytest.mark.parametrize("k,n", [(1, 1), (4, 2), (16, 16), (128, 256), (128, 8), (7, 100)])
def test_num_rank_pairs_counts_the_pairs_the_op_hands_the_kernel(k, n):
  assert num_rank_pairs(k, n) == len(rank_pairs(k, n)[0])


def test_field_names_of_dataclasses_and_named_tuples():
  assert field_names(Launch) == ("block_v", "num_warps")
  assert field_names(ChunkCumsumSettings) == ("num_warps",)
