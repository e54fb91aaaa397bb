"""Timing ops and whole models against the peer, and the reports: one registry of what can be timed
(`registry.MODES`), whose command line is experiments/bench.py."""
