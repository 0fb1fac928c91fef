"""`miles dashboard` served by its own command, on a free loopback port, for the dashboard and security tests."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from miles.serving.process import stop_process

# written by a real run of this repository: see tests/dashboard/conftest.py
RECORDED = Path(__file__).resolve().parents[1] / "dashboard" / "recorded_run"


@dataclass
class Served:
    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        stop_process(self.process, 15)


def serve(run_dir: Path, *flags: str, env: dict | None = None) -> Served:
    """`miles dashboard RUN_DIR --port 0 ...` as a subprocess; returns once it printed its URL (it listens
    before printing)."""
    process = subprocess.Popen([sys.executable, "-m", "miles.dashboard.cli", str(run_dir), "--port", "0", *flags],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    line = process.stdout.readline()
    found = re.search(r"(http://\S+?)/? ", line)
    if not found:
        process.kill()
        raise RuntimeError(f"dashboard did not start: {line}{process.stdout.read()}")
    return Served(found.group(1), process)


def copy_recorded(tmp_path: Path) -> Path:
    """A copy of the recorded run, so a test that adds files never touches the original."""
    target = tmp_path / "run"
    shutil.copytree(RECORDED, target)
    return target


def serve_dashboard(tmp_path: Path, run_dir: Path | None = None) -> Served:
    """Serve `run_dir` (default: a copy of the recorded run)."""
    return serve(copy_recorded(tmp_path) if run_dir is None else run_dir)
