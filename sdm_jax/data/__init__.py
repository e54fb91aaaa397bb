"""grain pipelines: synthetic recall tasks (MQAR, needle in a haystack) and byte-level language modelling."""

from sdm_jax.data.pipeline import TASKS, default_data_config, make_dataset, make_iterator
from sdm_jax.data.task import DataError

__all__ = ["DataError", "TASKS", "default_data_config", "make_dataset", "make_iterator"]
