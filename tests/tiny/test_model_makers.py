"""The suite's background checkpoint makers (tests/support/model_makers.py): started only for what is missing,
each in its own process with its own log, and a failed one named at the end instead of passing silently."""
from __future__ import annotations

from pathlib import Path

from tests.support import model_makers

ROOT = Path(__file__).resolve().parents[2]


def test_only_missing_checkpoints_get_a_maker_and_a_failed_one_is_named(monkeypatch):
    monkeypatch.setattr(model_makers, "MAKERS", {
        "cached": (lambda: True, "raise SystemExit('must not run')", 0),
        "good": (lambda: False, "import os; print('made it', os.environ['OMP_WAIT_POLICY'])", 0),
        "second": (lambda: False, "print('made the second')", 1),
        "broken": (lambda: False, "raise SystemExit(3)", 1),
        "after broken": (lambda: False, "print('must not run')", 1),
    })
    started = model_makers.start(ROOT)
    assert [name for name, _, _ in started] == ["good", "second, broken, after broken"]  # a process per lane
    for _, proc, _ in started:
        proc.wait(timeout=60)
    lines = model_makers.stop(started)
    assert len(lines) == 1 and "broken" in lines[0] and "exit 3" in lines[0]
    logs = {name: log.read_text() for name, _, log in started}
    assert "made it PASSIVE" in logs["good"]  # torch's idle threads sleep beside the workers
    second = logs["second, broken, after broken"]
    assert "made the second" in second and "must not run" not in second  # in order, stopped at the failure
    for _, _, log in started:
        log.unlink()


def test_a_maker_still_running_at_the_end_is_ended(monkeypatch):
    monkeypatch.setattr(model_makers, "MAKERS", {"slow": (lambda: False, "import time; time.sleep(600)", 0)})
    started = model_makers.start(ROOT)
    (_, proc, log), = started
    assert model_makers.stop(started) == []
    assert proc.returncode is not None  # killed by its PID, waited for
    log.unlink()
