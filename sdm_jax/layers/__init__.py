"""flax.nnx layers: the token mixers (dense delta rule, Sparse Delta Memory, attention) and their block parts."""

from sdm_jax.layers.attention import Attention, rotary
from sdm_jax.layers.block import Block
from sdm_jax.layers.conv import CausalConv
from sdm_jax.layers.decay import LogDecay
from sdm_jax.layers.delta import PRESETS, DeltaLayerConfig, DeltaMixer, OutputGate, layer_config
from sdm_jax.layers.mla import MultiHeadLatentAttention
from sdm_jax.layers.mlp import SwiGLU
from sdm_jax.layers.norm import RMSNorm
from sdm_jax.layers.sdm import SparseDeltaMemory

__all__ = ["Attention", "Block", "CausalConv", "DeltaLayerConfig", "DeltaMixer", "LogDecay", "MultiHeadLatentAttention",
           "OutputGate", "PRESETS", "RMSNorm", "SparseDeltaMemory", "SwiGLU", "layer_config", "rotary"]
