"""grain pipelines: synthetic recall tasks (MQAR, needle in a haystack) and byte-level language modelling."""

from sdm_jax.data.pipeline import TASKS, default_data_config, make_dataset, make_iterator

__all__ = ["TASKS", "default_data_config", "make_dataset", "make_iterator"]
