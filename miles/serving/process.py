"""A loopback HTTP service run as a child process: start it, wait until it answers, stop it.

Engines and the router both run this way in a plain run, so neither competes with the
trainer's own Python thread; readiness is a health endpoint answering 200 within a
deadline, and a service that dies first raises with the tail of its log.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from miles.config.secrets import child_env
from miles.serving.held_port import handed_env
from miles.serving.parent_watch import parent_env

STOP_GRACE_S = 15.0
LOG_TAIL_CHARS = 4000
# Run from the directory that holds the `miles` package, so `python -m miles...` resolves to
# this checkout even when the caller's working directory is elsewhere.
REPO_ROOT = str(Path(__file__).resolve().parents[2])  # the checkout (services start there)
# Secret-named variables (miles.config.secrets' name rule) a service still inherits: the Hugging Face
# Hub token, so an engine may load a gated model by its Hub id. Every other one (tracker keys, cloud
# credentials, MY_SERVICE_TOKEN, the run's admin tokens) a service gets only when its launcher passes it.
# the Hub token, and proxies (a proxy URL may carry credentials, N41, but an engine needs it to reach the Hub)
SERVICE_KEEP_ENV = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                              "http_proxy", "https_proxy", "all_proxy"})


class ServiceStartError(RuntimeError):
    """The service exited or never became healthy; the message holds its command and log tail."""


def free_port(host: str = "127.0.0.1", preferred: int | None = None) -> int:
    """`preferred` if it can be bound on `host`, else a port the OS picks."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port on {host}")


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (signal 0 sends nothing). A PermissionError says it exists and
    belongs to another user: alive, not gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports, held open together while they are picked: ports picked one
    at a time can repeat (Ray refuses a port given to two of its components)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_healthy(url: str, timeout: float, process: subprocess.Popen | None = None, path: str = "/health",
                 error: type[Exception] = ServiceStartError) -> None:
    """Poll `url + path` until it answers 200; raise TimeoutError at the deadline, or `error`
    as soon as `process` (when given) has exited."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    with httpx.Client(timeout=10.0) as client:
        while True:
            if process is not None and process.poll() is not None:
                raise error(f"the process exited with code {process.returncode} before it was healthy")
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


def stop_process(process: subprocess.Popen, grace: float = STOP_GRACE_S) -> int | None:
    """Terminate a child process, then kill it if it is still there after `grace` seconds; its exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=grace)
    return process.returncode


@dataclass
class ServiceProcess:
    url: str
    pid: int
    port: int
    process: subprocess.Popen = field(repr=False)
    log_path: Path | None = None
    # how `wait_ready` knows it is up, and what it raises otherwise (set by `start_service`)
    health_path: str = field(default="/health", repr=False)
    argv: list[str] = field(default_factory=list, repr=False)
    error: type[Exception] = field(default=ServiceStartError, repr=False)

    def wait_ready(self, timeout: float) -> "ServiceProcess":
        """Return once the health endpoint answers 200; else stop the process and raise `error` with its command
        and the tail of its log (it exited, or `timeout` seconds passed)."""
        try:
            wait_healthy(self.url, timeout, process=self.process, path=self.health_path, error=self.error)
        except (self.error, TimeoutError) as exc:
            self.stop()
            raise self.error(f"{exc}\ncommand: {' '.join(self.argv)}\nlog {self.log_path} ends with:\n"
                             f"{log_tail(self.log_path)}") from None
        return self

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """Terminate the service, then kill it if it is still there after `grace` seconds."""
        return stop_process(self.process, grace)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def exit_code(self) -> int | None:
        """The process's exit status, None while it runs (a supervisor's liveness check)."""
        return self.process.poll()

    def kill(self) -> None:
        """SIGKILL, as a supervisor ends a hung service (a SIGSTOP'd process dies of it too), and reap it."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def __enter__(self) -> "ServiceProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_service(argv: list[str], host: str, port: int, log_path: Path, *, health_path: str, timeout: float,
                  env: dict[str, str] | None = None, error: type[Exception] = ServiceStartError,
                  wait: bool = True, held: socket.socket | None = None) -> ServiceProcess:
    """Run `argv` (which serves on host:port) with its output in `log_path`; return once healthy, or at once
    with `wait=False` (then `wait_ready` before use: several services start together). `held`: the port's
    bound socket (held_port.hold_port), handed to the service to listen on and closed here."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log_path, "ab") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=service_env({**(env or {}), **(handed_env(held) if held else {})}),
                                       cwd=REPO_ROOT, pass_fds=(held.fileno(),) if held else ())
    finally:
        if held is not None:
            held.close()  # the service has its own copy: the port is its now
    service = ServiceProcess(url=f"http://{host}:{port}", pid=process.pid, port=port, process=process,
                             log_path=log_path, health_path=health_path, argv=list(argv), error=error)
    return service.wait_ready(timeout) if wait else service


# libgomp (torch's OpenMP on CPU) lets a thread spin for a while after each parallel region before it
# sleeps. Where a process's torch threads share cores with other processes (a rank beside its engine and the
# driver, two runs on one node), the spinning threads hold cores the others need and each barrier waits on
# threads the kernel has descheduled: SmolLM2's test run took 185-197 s beside a one-core busy loop on a
# 2-core machine, 64-78 s with passive waiting (threads sleep at once). A value the user set is kept.
OMP_WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def passive_omp(environ) -> dict[str, str]:
    """What a child needs for its OpenMP threads to sleep while they wait: nothing if `environ` (the user)
    chose a wait policy already."""
    return {} if OMP_WAIT_POLICY_ENV in environ else {OMP_WAIT_POLICY_ENV: "PASSIVE"}


def service_env(extra: dict[str, str] | None) -> dict[str, str]:
    """This process's environment without the secrets a service does not need (it gets those it
    needs in `extra`), passive OpenMP waiting unless the user chose, plus this pid for the service's
    parent watch."""
    env = child_env(dict(os.environ), SERVICE_KEEP_ENV)
    return {**env, **passive_omp(env), **(extra or {}), **parent_env()}


def log_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError as exc:
        return f"(log unreadable: {exc})"
