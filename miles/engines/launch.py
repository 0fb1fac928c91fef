"""Start an engine as a subprocess (`python -m miles.engines.cli`) and wait until it can generate.

The trainer, the router tests and the Prefect tasks all start engines through
`launch_engine`; readiness is `/health_generate` answering 200 within a deadline, and
an engine that dies first raises `EngineStartError` carrying the tail of its log.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

DEFAULT_START_TIMEOUT_S = 180.0
STOP_GRACE_S = 15.0
LOG_TAIL_CHARS = 4000


class EngineStartError(RuntimeError):
    """The engine exited or never became healthy; the message holds its command and log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout: float = DEFAULT_START_TIMEOUT_S, process: subprocess.Popen | None = None,
                 path: str = "/health_generate") -> None:
    """Poll `url + path` until it answers 200; raise TimeoutError at the deadline, or EngineStartError
    as soon as `process` (when given) has exited."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    with httpx.Client(timeout=10.0) as client:
        while True:
            if process is not None and process.poll() is not None:
                raise EngineStartError(f"the engine exited with code {process.returncode} before it was healthy")
            try:
                response = client.get(url + path)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{url}{path} was not healthy within {timeout:.0f}s (last: {last})")
            time.sleep(0.25)  # poll interval of the readiness loop, bounded by the deadline above


@dataclass
class EngineHandle:
    url: str
    pid: int
    port: int
    process: subprocess.Popen = field(repr=False)
    log_path: Path | None = None

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """Terminate the engine, then kill it if it is still there after `grace` seconds."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=grace)
        return self.process.returncode

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def __enter__(self) -> "EngineHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def engine_command(model_dir: str | Path | None, host: str, port: int, engine: str, device: str,
                   max_batch_size: int | None, extra_args: list[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "miles.engines.cli", "--host", host, "--port", str(port), "--engine", engine,
            "--engine-device", device]
    if model_dir is not None:
        argv += ["--model", str(model_dir)]
    if max_batch_size is not None:
        argv += ["--engine-max-batch-size", str(max_batch_size)]
    return argv + list(extra_args)


def launch_engine(model_dir: str | Path | None, *, host: str = "127.0.0.1", port: int | None = None,
                  engine: str = "embedded", device: str = "auto", max_batch_size: int | None = None,
                  log_path: str | Path | None = None, env: dict[str, str] | None = None,
                  extra_args: list[str] = (), timeout: float = DEFAULT_START_TIMEOUT_S) -> EngineHandle:
    """Start an engine serving `model_dir` (None: the tiny base model) and return once it generates."""
    if log_path is None:
        log_path = Path(tempfile.mkdtemp(prefix="miles-engine-")) / "engine.log"
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    argv = engine_command(model_dir, host, port, engine, device, max_batch_size, list(extra_args))
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **(env or {})}, cwd=_repo_root())
    handle = EngineHandle(url=f"http://{host}:{port}", pid=process.pid, port=port, process=process,
                          log_path=log_path)
    try:
        wait_healthy(handle.url, timeout, process=process)
    except (EngineStartError, TimeoutError) as exc:
        handle.stop()
        raise EngineStartError(f"{exc}\ncommand: {' '.join(argv)}\nlog {log_path} ends with:\n"
                               f"{_tail(log_path)}") from None
    return handle


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError as exc:
        return f"(log unreadable: {exc})"


def _repo_root() -> str:
    # Run from the directory that holds the `miles` package, so `-m miles.engines.cli` resolves
    # to this checkout even when the caller's working directory is elsewhere.
    return str(Path(__file__).resolve().parents[2])
