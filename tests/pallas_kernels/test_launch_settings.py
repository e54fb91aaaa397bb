"""The launch settings each kernel's default rule gives at the shapes the benchmarks time (GDN-2 / KDA at B 4,
T 4096, H 16, K = V = 128, chunk 32 and 64, on the H200), so that changing a rule is a visible decision: the
values below are those measured fastest in the records the rules cite."""

import jax.numpy as jnp
import pytest

from pallas_kernels.delta_rule_bwd import IntraChunkBwdSettings, StatePassBwdSettings
from pallas_kernels.delta_rule_fwd import (SHARED_MEMORY, ChunkCumsumSettings, IntraChunkSettings,
                                           StatePassSettings)
from pallas_kernels.mixer_inputs import MixerInputsSettings
from pallas_kernels.product_key import ProductKeySettings
from sdm_jax.ops.product_key import candidate_rank_pairs

B, T, H, K, V = 4, 4096, 16, 128, 128
H200 = SHARED_MEMORY["9.0"]


@pytest.mark.parametrize("chunk_size,warps", [(32, 2), (64, 4)])
def test_per_chunk_kernels(chunk_size, warps):
  assert IntraChunkSettings.default(chunk_size) == IntraChunkSettings(
      key_block=32, sub_block=4, num_warps=warps, solve_key_block=64, solve_value_block=64, solve_warps=4,
      num_stages=1, solve_stages=2)
  assert IntraChunkBwdSettings.default(chunk_size) == IntraChunkBwdSettings(
      key_block=32, value_block=32, num_warps=warps, num_stages=2, pair_key_block=32, pair_warps=warps, sub_block=4)


@pytest.mark.parametrize("chunk_size,dtype,stages", [
    (32, jnp.bfloat16, 3), (64, jnp.bfloat16, 3), (32, jnp.float32, 3), (64, jnp.float32, 1)])
def test_state_passes(chunk_size, dtype, stages):
  for cls in (StatePassSettings, StatePassBwdSettings):
    want = cls(block_v=64, num_warps=4, num_stages=stages)
    assert cls.for_shape(chunk_size, B, H, K, V, dtype, shared_memory=H200) == want


@pytest.mark.parametrize("batch,block_v", [(8, 64), (4, 64), (2, 32), (1, 16)])
def test_state_block_v_at_the_measured_batches(batch, block_v):
  """The measured picks at B x T = 32,768 tokens, H 16 (benchmarks/ops/README.md, launch settings)."""
  settings = StatePassSettings.for_shape(32, batch, H, K, V, jnp.bfloat16, shared_memory=H200)
  assert settings.block_v == block_v


def test_memory_bound_launches_and_addressing():
  assert ChunkCumsumSettings.default() == ChunkCumsumSettings(num_warps=4)
  assert MixerInputsSettings.default() == MixerInputsSettings(rows=32, num_warps=4)
  # The addressing bench: n = 256 sub-keys per half, k = 128 (benchmarks/ops/README.md, launch settings).
  num_pairs = len(candidate_rank_pairs(128, 128)[0])
  assert ProductKeySettings.for_shape(256, num_pairs) == ProductKeySettings(block_rows=16, block_cols=128,
                                                                            num_warps=16)
