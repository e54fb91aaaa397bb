"""absl entry points: `python -m experiments.<tool> --flags` from the repository root."""
