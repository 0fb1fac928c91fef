"""`pid_alive` is the one liveness probe of a pid: a process that exists but belongs to another user
(os.kill answers PermissionError) is alive. Its two copies disagreed: the Prefect server's stop raised."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from miles.serving import process
from miles.serving.process import pid_alive

ROOT = Path(__file__).resolve().parents[2]
SIGNAL_ZERO = re.compile(r"os\.kill\([^,]+,\s*0\)")


def test_a_running_process_is_alive_and_a_reaped_one_is_not():
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(60)
    assert not pid_alive(child.pid)


def test_a_process_of_another_user_is_alive(monkeypatch):
    def refuse(pid, sig):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(process.os, "kill", refuse)
    assert pid_alive(4242)


def test_it_is_the_only_signal_zero_probe():
    probes = [f"{path.relative_to(ROOT)}:{n}" for folder in ("miles", "flows", "tasks", "benchmarks")
              for path in (ROOT / folder).rglob("*.py")
              for n, line in enumerate(path.read_text().splitlines(), 1) if SIGNAL_ZERO.search(line)]
    assert len(probes) == 1 and probes[0].startswith("miles/serving/process.py:"), probes
