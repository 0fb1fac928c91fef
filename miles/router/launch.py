"""Start the router as a subprocess (`python -m miles.router.cli`) and wait until it answers.

A plain run uses this rather than the in-process router: proxying in the trainer's own
process would compete with the rollout client for the same interpreter lock.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from miles.config import RouterConfig
from miles.config.argv import section_argv
from miles.config.secrets import RUN_TOKEN_ENV, resolve_admin_token
from miles.serving.held_port import PortUnavailable, hold_port
from miles.serving.process import ServiceProcess, ServiceStartError, start_service



def router_command(config: RouterConfig, host: str, port: int, worker_urls: list[str]) -> list[str]:
    """The command line for `config`; the admin token is left out (it travels in the environment,
    never in argv where `ps` shows it)."""
    argv = [sys.executable, "-m", "miles.router.cli", "--host", host, "--port", str(port)]
    if worker_urls:
        argv += ["--worker-urls", *worker_urls]
    return argv + section_argv(config)


def launch_router(config: RouterConfig, *, host: str = "127.0.0.1", port: int | None = None,
                  worker_urls: list[str] = (), log_path: str | Path | None = None, serve_args: list[str] = (),
                  timeout: float = 60.0) -> ServiceProcess:
    """Start a router process in front of `worker_urls`; return once `/router_health` answers.
    `serve_args`: further `miles router` serve flags (e.g. --timeline-path)."""
    if log_path is None:
        log_path = Path(tempfile.mkdtemp(prefix="miles-router-")) / "router.log"
    try:
        held = hold_port(host, port)  # the router listens on this very socket (held_port.py)
    except PortUnavailable as exc:
        raise ServiceStartError(f"the router's port: {exc}") from None
    port = held.getsockname()[1]
    token = resolve_admin_token(config)  # the flag's, else this process's environment's
    env = {RUN_TOKEN_ENV: token} if token else None
    argv = router_command(config, host, port, list(worker_urls)) + list(serve_args)
    return start_service(argv, host, port, Path(log_path),
                         health_path="/router_health", timeout=timeout, env=env, error=ServiceStartError,
                         held=held)
