"""`miles replay-spool` on a copy of a finished run: the command, and the edit of a copy's delivery
state (the run itself and its copy are fixtures of tests/security/conftest.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.tracking.tracking_helpers import REPO, subprocess_env

TRACKERS = ["--use-mlflow", "--use-tensorboard"]


def replay_spool(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "flows.cli", "replay-spool", str(run_dir), "--timeout", "5",
               *args]
    return subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                          timeout=300)


def edit_delivery(run_dir: Path, change) -> None:
    path = run_dir / "tracking" / "delivery.json"
    state = json.loads(path.read_text())
    change(state)
    path.write_text(json.dumps(state))
