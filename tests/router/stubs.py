"""Stub engines (tests/router/stub_engine.py) as real processes on loopback, for the router tests."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.wait import wait_for

STUB = Path(__file__).with_name("stub_engine.py")


@dataclass
class Stub:
    """One stub engine process."""

    proc: subprocess.Popen
    url: str
    port: int

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def launch_stub(*args: str, port: int = 0, ready_timeout: float = 60.0) -> Stub:
    proc = subprocess.Popen([sys.executable, str(STUB), "--port", str(port), *args], stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"stub engine did not start: {line!r}")
    stub = Stub(proc, match.group(0), int(match.group(1)))

    def answers() -> bool:
        try:
            return httpx.get(stub.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    wait_for(answers, ready_timeout, f"stub engine at {stub.url}")
    return stub
