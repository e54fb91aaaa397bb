"""Pure functional ops: the recurrences and the public API of SPEC.md section 5."""

from sdm_jax.ops.delta_rule import generalized_delta_rule, l2norm
from sdm_jax.ops.mixers import fg2_gdn, fg2_gdn_plus, gated_delta_rule, gdn2, kda

__all__ = ["gated_delta_rule", "kda", "fg2_gdn", "fg2_gdn_plus", "gdn2", "generalized_delta_rule", "l2norm"]
