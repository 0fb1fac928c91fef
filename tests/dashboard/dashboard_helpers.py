"""Shared by the dashboard tests: where the recorded run is, and the dashboard served by its own command."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from miles.serving.process import stop_process

RECORDED = Path(__file__).parent / "recorded_run"


@dataclass
class Served:
    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        stop_process(self.process, 15)


def serve(run_dir: Path, *flags: str, env: dict | None = None) -> Served:
    """`miles dashboard RUN_DIR --port 0 ...` as a subprocess; returns once it printed its URL."""
    process = subprocess.Popen([sys.executable, "-m", "miles.dashboard.cli", str(run_dir), "--port", "0", *flags],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    line = process.stdout.readline()
    found = re.search(r"(http://\S+?)/? ", line)
    if not found:
        process.kill()
        raise RuntimeError(f"dashboard did not start: {line}{process.stdout.read()}")
    return Served(found.group(1), process)
