"""Model evaluation: recall accuracy, perplexity and run summaries (op and model timing is sdm_jax.benchmarking)."""
