"""Checkpoints of the field's reference code as our models and layers, and ours as theirs (DESIGN.md section 4)."""

from sdm_jax.interop.fla import fla_config, fla_layer, load_fla, save_fla

__all__ = ["fla_config", "fla_layer", "load_fla", "save_fla"]
