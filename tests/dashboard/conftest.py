"""Each test serves its own copy of a run this repository recorded.

`recorded_run/` was written by a real run of this repository (the plain loop, two training
ranks, samples and tokens logged every 2 rollouts):

    python -m miles.train --num-rollout 4 --rollout-batch-size 4 --n-samples-per-prompt 4 \
        --eval-interval 2 --eval-max-prompts 8 --log-samples-interval 2 --actor-num-gpus-per-node 2

keeping its journal, timeline, samples, tokens, base eval and redacted config. Tests serve a
copy, so a test that adds files (health verdicts, a torn line) never touches the original.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.dashboard import copy_recorded
from webdriver import Browser, missing_browser


@pytest.fixture
def run_copy(tmp_path) -> Path:
    return copy_recorded(tmp_path)


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per module (skipped where there is none)."""
    if missing_browser():
        pytest.skip(missing_browser())
    b = Browser()
    try:
        yield b
    finally:
        b.close()
