"""The calls the custom-logger hooks of tests/tracking/test_hooks.py record: a list of its own module,
so the hook file the test writes imports it from here, not from the test module."""
from __future__ import annotations

CALLS: list[tuple] = []
