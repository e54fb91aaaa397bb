"""Pallas GPU kernels; depends on jax alone."""
