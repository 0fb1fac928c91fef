"""Start an engine as a subprocess (`python -m miles.engines.cli`) and wait until it can generate.

The trainer, the router tests and the Prefect tasks all start engines through
`launch_engine`; readiness is `/health_generate` answering 200 within a deadline, and
an engine that dies first raises `EngineStartError` carrying the tail of its log.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import tempfile
from pathlib import Path

from miles.config import EngineConfig
from miles.config.argv import section_argv
from miles.serving.held_port import PortUnavailable, hold_port
from miles.serving.process import ServiceProcess, ServiceStartError, free_port, start_service
from miles.serving.process import wait_healthy as _wait_healthy

DEFAULT_START_TIMEOUT_S = 180.0

__all__ = ["EngineHandle", "EngineStartError", "engine_command", "free_port", "launch_engine", "wait_healthy"]


class EngineStartError(ServiceStartError):
    """The engine exited or never became healthy; the message holds its command and log tail."""


EngineHandle = ServiceProcess  # url, pid, port, process, log_path; stop(), alive, context manager

wait_healthy = functools.partial(_wait_healthy, timeout=DEFAULT_START_TIMEOUT_S, path="/health_generate",
                                 error=EngineStartError)


def engine_command(model_dir: str | Path | None, host: str, port: int, config: EngineConfig) -> list[str]:
    """The command line of an engine configured by the whole `config` section."""
    argv = [sys.executable, "-m", "miles.engines.cli", "--host", host, "--port", str(port)]
    if model_dir is not None:
        argv += ["--model", str(model_dir)]
    # several quoted strings of extra SGLang arguments are one string to the shell-like split
    extra = [" ".join(config.sglang_extra_args)] if config.sglang_extra_args else []
    return argv + section_argv(dataclasses.replace(config, sglang_extra_args=extra))


def launch_engine(model_dir: str | Path | None, config: EngineConfig | None = None, *, host: str = "127.0.0.1",
                  port: int | None = None, log_path: str | Path | None = None, env: dict[str, str] | None = None,
                  serve_args: list[str] = (), timeout: float = DEFAULT_START_TIMEOUT_S,
                  wait: bool = True) -> EngineHandle:
    """Start an engine serving `model_dir` (None: the tiny base model) as `config` says (default: the
    defaults) and return once it generates (`wait=False`: at once; `handle.wait_ready(timeout)` before use).
    `serve_args`: further `miles engine` serve flags (e.g. --timeline-path)."""
    if log_path is None:
        log_path = Path(tempfile.mkdtemp(prefix="miles-engine-")) / "engine.log"
    config = config or EngineConfig()
    # the embedded engine listens on the socket bound here (held_port.py: no other process can take the port
    # while it loads); SGLang binds its own --port
    try:
        held = hold_port(host, port) if config.engine == "embedded" else None
    except PortUnavailable as exc:
        raise EngineStartError(f"the engine's port: {exc}") from None
    port = held.getsockname()[1] if held else (port or free_port(host))
    argv = engine_command(model_dir, host, port, config) + list(serve_args)
    return start_service(argv, host, port, Path(log_path), health_path="/health_generate", timeout=timeout, env=env,
                         error=EngineStartError, wait=wait, held=held)
