"""The project's own history gate: `miles doctor RUN --history DIR --history-mode enforce` against
the trusted records of tests/compare/history/default-short, and the failed rows of its table."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HISTORY = Path(__file__).resolve().parents[1] / "compare" / "history" / "default-short"


def gate(run_dir: Path, history: Path = HISTORY) -> tuple[int, str]:
    command = [sys.executable, "-m", "flows.cli", "doctor", str(run_dir), "--history", str(history),
               "--history-mode", "enforce"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout


def outside(report: str) -> dict[str, int]:
    """Signal -> first step, of the gate table's failed rows."""
    rows = [line.split() for line in report.splitlines()
            if " OUTSIDE " in line or " ERROR " in line]
    return {r[0]: int(r[2]) for r in rows}
