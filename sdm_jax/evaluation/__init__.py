"""Measuring the ops and models: random op inputs, impl comparison, throughput."""
