"""A run against its baselines: step-aligned curves, corridors per metric and step, verdicts, prompt diffs."""
