"""The dashboard's "diagnose" button: `miles diagnose RUN_DIR --json` in a child process (its py-spy and
Ray driver stay out of the server), one at a time; the answer is the verdict and the bundle's path."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import miles

DIAGNOSE_TIMEOUT_S = 300.0
ROOT = Path(miles.__file__).resolve().parents[1]  # the child imports this same `miles`


class Busy(RuntimeError):
    """A diagnosis of this run is already being written."""


class Failed(RuntimeError):
    """The diagnose command failed; the message is its last line of error output."""


_lock = threading.Lock()


def run_diagnose(run_dir: Path) -> dict:
    if not _lock.acquire(blocking=False):
        raise Busy("a diagnosis of this run is already being written; try again when it is done")
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        try:
            done = subprocess.run([sys.executable, "-m", "miles.diagnose.cli", str(run_dir), "--json"], env=env,
                                  capture_output=True, text=True, timeout=DIAGNOSE_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise Failed(f"miles diagnose did not finish in {DIAGNOSE_TIMEOUT_S:.0f} s") from None
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            error = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise Failed(f"miles diagnose failed (exit {done.returncode}): {error[:300]}")
        return json.loads(lines[-1])
    finally:
        _lock.release()
