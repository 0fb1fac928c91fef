"""Fixtures of the tracking tests."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def run_dir(tmp_path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path
