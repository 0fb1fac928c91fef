"""Router test fixtures: stub engines as real processes on loopback, routers started in-process."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from miles.config import RouterConfig
from miles.router import RouterHandle, start_router

STUB = Path(__file__).with_name("stub_engine.py")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


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


@pytest.fixture
def stubs():
    """`stubs(*args, port=0)` starts a stub engine process; every one is killed at teardown."""
    started: list[Stub] = []

    def start(*args: str, port: int = 0) -> Stub:
        stub = launch_stub(*args, port=port)
        started.append(stub)
        return stub
    yield start
    for stub in started:
        stub.kill()


@pytest.fixture
def router():
    """`router(worker_urls, timeline_path=None, **config)` starts an in-process router; all are stopped at teardown."""
    handles: list[RouterHandle] = []

    def start(worker_urls=(), timeline_path=None, **fields) -> RouterHandle:
        handle = start_router(RouterConfig(**fields), worker_urls=worker_urls, timeline_path=timeline_path)
        handles.append(handle)
        return handle
    yield start
    for handle in handles:
        handle.stop()
