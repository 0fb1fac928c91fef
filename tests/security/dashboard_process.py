"""`miles dashboard` served by its own command for the security probes (H1, A5, A6)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from miles.serving.process import stop_process

RECORDED = Path(__file__).parent.parent / "dashboard" / "recorded_run"


@dataclass
class Served:
    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        stop_process(self.process, 15)


def serve_dashboard(tmp_path: Path, run_dir: Path | None = None) -> Served:
    """Serve `run_dir` (default: a copy of the recorded run) on a free loopback port; returns once the
    dashboard printed its URL (it listens before printing)."""
    if run_dir is None:
        run_dir = tmp_path / "run"
        shutil.copytree(RECORDED, run_dir)
    process = subprocess.Popen([sys.executable, "-m", "miles.dashboard.cli", str(run_dir), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = process.stdout.readline()
    found = re.search(r"(http://\S+?)/? ", line)
    if not found:
        process.kill()
        raise RuntimeError(f"dashboard did not start: {line}{process.stdout.read()}")
    return Served(found.group(1), process)
