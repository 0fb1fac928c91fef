"""The miles cache: where the tiny task's data and base models are made once and kept (MILES_CACHE_DIR)."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "MILES_CACHE_DIR"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "miles"))
