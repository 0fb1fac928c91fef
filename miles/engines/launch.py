"""Start an engine as a subprocess (`python -m miles.engines.cli`) and wait until it can generate.

The trainer, the router tests and the Prefect tasks all start engines through
`launch_engine`; readiness is `/health_generate` answering 200 within a deadline, and
an engine that dies first raises `EngineStartError` carrying the tail of its log.
"""
from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

from miles.service_process import ServiceProcess, ServiceStartError, free_port, start_service
from miles.service_process import wait_healthy as _wait_healthy

DEFAULT_START_TIMEOUT_S = 180.0

__all__ = ["EngineHandle", "EngineStartError", "engine_command", "free_port", "launch_engine", "wait_healthy"]


class EngineStartError(ServiceStartError):
    """The engine exited or never became healthy; the message holds its command and log tail."""


EngineHandle = ServiceProcess  # url, pid, port, process, log_path; stop(), alive, context manager

wait_healthy = functools.partial(_wait_healthy, timeout=DEFAULT_START_TIMEOUT_S, path="/health_generate",
                                 error=EngineStartError)


def engine_command(model_dir: str | Path | None, host: str, port: int, engine: str, device: str,
                   max_batch_size: int | None, extra_args: list[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "miles.engines.cli", "--host", host, "--port", str(port), "--engine", engine,
            "--engine-device", device]
    if model_dir is not None:
        argv += ["--model", str(model_dir)]
    if max_batch_size is not None:
        argv += ["--engine-max-batch-size", str(max_batch_size)]
    return argv + list(extra_args)


# Passed on their own by launch_engine's arguments; every other EngineConfig field travels as a flag.
_OWN_ARGS = ("engine", "engine_device", "engine_max_batch_size", "sglang_extra_args")


def engine_flags(config) -> list[str]:
    """The EngineConfig fields not given to launch_engine directly, as `miles engine` flags (set ones only)."""
    import dataclasses

    from miles.config.fields import is_secret_name

    argv = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in _OWN_ARGS or value is None or value == f.default:
            continue
        if f.metadata.get("secret") or is_secret_name(f.name):  # never on a command line (ps shows it)
            continue
        argv += ["--" + f.name.replace("_", "-"), str(value)]
    return argv


def launch_engine(model_dir: str | Path | None, *, host: str = "127.0.0.1", port: int | None = None,
                  engine: str = "embedded", device: str = "auto", max_batch_size: int | None = None,
                  log_path: str | Path | None = None, env: dict[str, str] | None = None,
                  extra_args: list[str] = (), timeout: float = DEFAULT_START_TIMEOUT_S) -> EngineHandle:
    """Start an engine serving `model_dir` (None: the tiny base model) and return once it generates."""
    if log_path is None:
        log_path = Path(tempfile.mkdtemp(prefix="miles-engine-")) / "engine.log"
    port = port or free_port(host)
    argv = engine_command(model_dir, host, port, engine, device, max_batch_size, list(extra_args))
    return start_service(argv, host, port, Path(log_path), health_path="/health_generate", timeout=timeout, env=env,
                         error=EngineStartError)
