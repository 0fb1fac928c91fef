"""Probe CN5: `miles compare RUN H1 H1` was "2 baseline(s): H1, H1": a baseline given twice has no spread
against itself, so the corridor lost the jitter widening a single baseline gets, and nothing said so.
Now one line naming it, exit 2."""
from __future__ import annotations

from tests.compare.compare_helpers import copy_run, miles


def test_a_baseline_given_twice_is_refused(tmp_path):
    run, baseline = copy_run(tmp_path / "run"), copy_run(tmp_path / "H1")
    for twice in ([baseline, baseline], [baseline, tmp_path / "." / "H1"]):
        done = miles("compare", run, *twice)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "BASELINE_DIR:" in done.stderr and "is given twice (also as" in done.stderr
        assert "Traceback" not in done.stderr
    assert miles("compare", run, baseline).returncode == 0
