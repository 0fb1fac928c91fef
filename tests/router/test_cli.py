"""`miles router` as a process: serves on loopback, refuses an open admin API, never prints the token."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import httpx

from tests.support.wait import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def miles_router(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flows.cli", "router", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def test_serves_registered_workers_and_stops_on_sigterm(stubs):
    stub = stubs()
    token = "tok-" + "x" * 20
    proc = miles_router("--port", "0", "--worker-urls", stub.url, "--policy", "round-robin",
                        env={"MILES_ROUTER_ADMIN_TOKEN": token})
    try:
        settings = json.loads(proc.stdout.readline())  # the effective settings come first, as one JSON line
        assert settings["service"] == "router" and settings["settings"]["router_admin_token"] != token
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        assert "round-robin" in line

        def answers():
            try:
                return httpx.get(url + "/router_health", timeout=2).json()["healthy_workers"] == 1
            except httpx.HTTPError:
                return False
        wait_for(answers, 60, "the router process")
        assert httpx.post(url + "/generate", json={}).json()["text"] == "42"
        assert httpx.post(url + "/add_worker", json={"url": stub.url}).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal so the parent sees why it ended.
    assert proc.returncode in (0, -signal.SIGTERM) and "Traceback" not in err
    assert token not in line + out + err


def test_refuses_to_bind_beyond_loopback_without_a_token():
    env = {k: v for k, v in os.environ.items() if k != "MILES_ROUTER_ADMIN_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "flows.cli", "router", "--host", "0.0.0.0", "--port", "0"],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert "--router-admin-token" in done.stderr and "0.0.0.0" in done.stderr


def test_bad_flags_are_named():
    done = subprocess.run([sys.executable, "-m", "flows.cli", "router", "--worker-urls", "localhost:1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--worker-urls" in done.stderr and "localhost:1" in done.stderr
    done = subprocess.run([sys.executable, "-m", "flows.cli", "router", "--policy", "fastest"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "fastest" in done.stderr
