"""Fixtures of the profiling tests."""
import pytest
from profiling_helpers import profiling_config


@pytest.fixture
def make_config(tmp_path):
    return lambda *extra: profiling_config(tmp_path, *extra)
