"""Training: optax optimizer, jitted steps over a device mesh, orbax checkpoints, metrics."""
