"""The language model that stacks the layers from a pattern string, its config and parameter helpers; its loss
(loss.py) and the device mesh its arrays are placed on (sharding.py), shared by training and evaluation."""

from sdm_jax.models.config import default_config
from sdm_jax.models.lm import LanguageModel, layer_letters
from sdm_jax.models.params import count_params, no_decay_mask

__all__ = ["LanguageModel", "count_params", "default_config", "layer_letters", "no_decay_mask"]
