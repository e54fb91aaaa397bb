"""Timing ops and whole models against the peer, and the reports."""
