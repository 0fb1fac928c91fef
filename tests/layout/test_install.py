"""`make install` leaves the installed packages' bytecode compiled. Where PYTHONDONTWRITEBYTECODE is set (this
machine and CI set it) no process writes it later, so an install that skipped it (uv's default, pip's
--no-compile) had every engine, rank and driver compile its imports from source at each start: 5.0 CPU-s
instead of 3.0 for transformers, Ray, Prefect and MLflow, and a clean clone's suite took 1,490 s instead of
about 900 (2026-12-06)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

# large modules every run's processes import (an engine, a rank, the driver, a delivery process)
HEAVY = ["torch._tensor", "transformers.modeling_utils", "ray.actor", "prefect.client.schemas.objects",
         "mlflow.tracking.client", "pandas.core.frame", "fastapi.routing"]


@pytest.mark.parametrize("name", HEAVY)
def test_installed_modules_have_their_bytecode(name):
    module = importlib.import_module(name)
    source = Path(module.__file__)
    assert Path(sys.prefix) in source.parents, f"{name} is not from this venv: {source}"
    cached = Path(importlib.util.cache_from_source(str(source)))
    assert cached.exists(), f"{name} has no compiled bytecode ({cached}): install with bytecode compiled (Makefile)"
