"""Start (or find) the one local Prefect server that a run's flow and all its Ray workers report to.

Prefect's ephemeral mode would give every Ray worker process its own temporary API, so
task runs would scatter; a real server on loopback, whose URL travels to the workers in
`PREFECT_API_URL`, keeps them in one place. The server runs on SQLite under a state dir.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from miles.config.prefect_home import default_state_dir, read_record, write_record
from miles.config.secrets import child_env
from miles.serving.process import free_port, log_tail, pid_alive, wait_healthy

DEFAULT_PORT = 4200


@dataclass(frozen=True)
class PrefectServer:
    """A running Prefect API: its URL and, when we started it, the process and its state dir."""

    api_url: str
    pid: int | None = None
    home: Path | None = None
    started_here: bool = False

    @property
    def ui_url(self) -> str:
        return self.api_url.removesuffix("/api")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server if we started it (by PID; uvicorn gets SIGTERM, then SIGKILL)."""
        if self.pid is None:
            return
        _terminate(self.pid, timeout)


def is_healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{api_url}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def start_server(home: Path, port: int | None = None, timeout: float = 120.0, ui: bool = True) -> PrefectServer:
    """Start `prefect server start` on 127.0.0.1 with SQLite under `home`; return once healthy."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port(preferred=port)
    api_url = f"http://127.0.0.1:{port}/api"
    # Neither the caller's Prefect settings nor any secret-named variable (it needs none; its
    # database is the SQLite file named below).
    env = {k: v for k, v in child_env(dict(os.environ)).items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_UI_ENABLED="true" if ui else "false",
        PREFECT_API_URL=api_url,
    )
    log = home / "server.log"
    with log.open("ab") as out:
        # A new session so a Ctrl-C in the run's terminal does not kill a server left up for the UI.
        process = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                    "--port", str(port)],
                                   env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        wait_healthy(api_url.removesuffix("/api"), timeout, process, path="/api/health", error=RuntimeError)
    except RuntimeError as exc:
        _terminate(process.pid, 10.0)
        raise RuntimeError(f"Prefect server: {exc}; {log} ends with:\n{log_tail(log)}") from None
    except BaseException:
        _terminate(process.pid, 10.0)
        raise
    server = PrefectServer(api_url=api_url, pid=process.pid, home=home, started_here=True)
    write_record(home, api_url, process.pid)
    return server


def ensure_server(home: Path | None = None, port: int = DEFAULT_PORT, timeout: float = 120.0) -> PrefectServer:
    """The Prefect API to use: `PREFECT_API_URL` if set, else the local server under `home`
    (reused while healthy, started otherwise). Sets `PREFECT_API_URL` for this process."""
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        api_url = configured.rstrip("/")
        wait_healthy(api_url, timeout=min(timeout, 30.0), path="/health")
        return PrefectServer(api_url=api_url)
    home = home or default_state_dir()
    server = None
    known = read_record(home)
    if known is not None and is_healthy(known[0]):
        server = PrefectServer(api_url=known[0], pid=known[1], home=home)
    if server is None:
        server = start_server(home, port, timeout)
    os.environ["PREFECT_API_URL"] = server.api_url
    return server


def _terminate(pid: int, timeout: float) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)  # the server's own session: uvicorn and its children
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (a server from an earlier run): poll for it to vanish
            done = 0 if pid_alive(pid) else pid
        if done:
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
