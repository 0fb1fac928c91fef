"""Prefect tasks: thin, retryable wrappers around `miles` library calls."""
