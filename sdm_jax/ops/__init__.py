"""Pure functional ops: the mixer registry (`MIXERS`), the recurrences and the public API of DESIGN.md section 5."""

from sdm_jax.ops.delta_rule import generalized_delta_rule, l2norm
from sdm_jax.ops.mixers import fg2_gdn, fg2_gdn_plus, gated_delta_rule, gdn2, kda
from sdm_jax.ops.product_key import product_key_address, product_key_topk
from sdm_jax.ops.registry import MIXERS, Mixer, register
from sdm_jax.ops.sparse_delta import sparse_delta_rule

__all__ = ["gated_delta_rule", "kda", "fg2_gdn", "fg2_gdn_plus", "gdn2", "MIXERS", "Mixer", "register",
           "generalized_delta_rule", "l2norm",
           "product_key_address", "product_key_topk",
           "sparse_delta_rule"]
