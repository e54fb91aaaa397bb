"""sdm-jax: delta-rule recurrent token mixers in JAX and Pallas."""
