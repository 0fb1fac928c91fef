"""`miles engine`: serve a checkpoint over SGLang's HTTP API with the embedded engine, or start real SGLang.

The first line it prints is its effective settings as one JSON object (as SGLang prints its server args).

    miles engine --model DIR --host 127.0.0.1 --port 30000 [--engine-max-batch-size 64]
    miles engine --engine sglang --model DIR --sglang-tp-size 2      # needs a GPU and the [gpu] extra
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path

from miles.serving import auth
from miles.config import ConfigError, EngineConfig, EngineServeConfig, parse_sections
from miles.config.argv import print_settings
from miles.serving.held_port import release_handed_socket, take_handed_socket
from miles.serving.parent_watch import watch_parent

TOKEN_ENV = "MILES_ENGINE_ADMIN_TOKEN"


def resolve_admin_token(serve: EngineServeConfig) -> str | None:
    """The engine's admin token from the flag, else from the environment."""
    return serve.engine_admin_token or os.environ.get(TOKEN_ENV) or None


def main(argv: list[str] | None = None) -> int:
    watch_parent()  # launched by a trainer: die with it
    parsed = parse_sections([EngineServeConfig, EngineConfig], argv, prog="miles engine",
                            description=__doc__.strip().splitlines()[0])
    serve, engine = parsed[EngineServeConfig], parsed[EngineConfig]
    # the first line of its log; the admin token (from the flag or the environment) shows as ***
    print_settings("engine", dataclasses.replace(serve, engine_admin_token=resolve_admin_token(serve)), engine)
    if engine.engine == "sglang":
        if not auth.is_loopback(serve.host) and "--api-key" not in " ".join(engine.sglang_extra_args):
            raise ConfigError("--host", f"SGLang bound to {serve.host} (not loopback) needs its own key: pass "
                                        "--sglang-extra-args '--api-key ...'")
        if resolve_admin_token(serve):
            raise ConfigError("--engine-admin-token", "applies to the embedded engine only; SGLang takes "
                                                      "--sglang-extra-args '--api-key ...'")
        return _run_sglang(serve, engine)
    auth.require_token_off_loopback(serve.host, resolve_admin_token(serve), "--engine-admin-token", TOKEN_ENV,
                                    "the weight, pause and abort endpoints")
    return _run_embedded(serve, engine)


def check_model_dir(model: str) -> None:
    """A local path must be a directory holding an HF config.json (anything else is a Hub id)."""
    path = Path(model)
    if model.startswith((".", "/", "~")) or path.exists():
        if not path.is_dir():
            raise ConfigError("--model", f"{model} is not a directory (an HF checkpoint directory or a Hub id)")
        if not (path / "config.json").is_file():
            raise ConfigError("--model", f"{model} has no config.json: not an HF checkpoint directory")


def _model_dir(serve: EngineServeConfig) -> str:
    if serve.model:
        return serve.model
    from miles.tiny.warmstart import ensure_base_model

    return str(ensure_base_model(progress=False))


def _run_sglang(serve: EngineServeConfig, engine: EngineConfig) -> int:
    from miles.engines import sglang_launcher

    if serve.model is None:
        raise ConfigError("--model", "--engine sglang needs --model (an HF checkpoint directory or hub id)")
    if serve.timeline_path:
        raise ConfigError("--timeline-path", "only the embedded engine writes timeline spans (SGLang does not)")
    if serve.inject_slow_apply:
        raise ConfigError("--inject-slow-apply", "only the embedded engine takes this test hook")
    try:
        sglang_launcher.check_available()
    except sglang_launcher.SGLangUnavailable as exc:
        print(f"miles engine: error: {exc}", file=sys.stderr)
        return 2
    release_handed_socket()  # SGLang binds --port itself
    command = sglang_launcher.build_command(serve.model, serve.host, serve.port, engine, serve.weight_version)
    shown = ["***" if i and command[i - 1] == "--api-key" else arg for i, arg in enumerate(command)]
    print(f"miles engine: starting {shown}", file=sys.stderr, flush=True)
    sglang_launcher.exec_sglang(command)
    return 0  # not reached: exec replaced the process


def _run_embedded(serve: EngineServeConfig, engine: EngineConfig) -> int:
    from miles.engines.push_spans import EngineCoords, parse_slow_apply

    slow_apply = parse_slow_apply(serve.inject_slow_apply)  # a bad spec is refused before loading
    model_dir = _model_dir(serve)
    check_model_dir(model_dir)  # before torch and transformers load: a wrong path is refused in a blink

    import uvicorn

    from miles.serving import auth
    from miles.engines.model_runner import ModelRunner
    from miles.engines import weight_update
    from miles.engines.server import EngineServer
    from miles.record.timeline import TimelineWriter
    from miles.serving.limits import BodyLimit, guarded_protocol
    from miles.serving.origin_guard import OriginGuard

    logging.basicConfig(level=serve.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        runner = ModelRunner(model_dir, device=engine.engine_device, context_length=engine.context_length,
                             cpu_threads=engine.engine_cpu_threads, dtype=engine.engine_dtype)
    except Exception as exc:  # tokenizer, config or weight files the loaders refuse (truncated safetensors, ...)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError("--model", f"cannot load {model_dir}: {type(exc).__name__}: {first}") from None
    timeline = TimelineWriter(Path(serve.timeline_path) if serve.timeline_path else None,
                              lane=f"engine {serve.host}:{serve.port}")
    coords = EngineCoords(serve.engine_index, f"http://{serve.host}:{serve.port}")
    server = EngineServer(runner, engine, weight_version=serve.weight_version, timeline=timeline,
                          admin_token=resolve_admin_token(serve), coords=coords,
                          slow_apply=slow_apply)
    print(f"miles engine: serving {model_dir} on http://{serve.host}:{serve.port} ({runner.device}, "
          f"max batch {engine.engine_max_batch_size})", file=sys.stderr, flush=True)
    # a weight push is as large as the model: its own bound, from the served model's parameters
    app = BodyLimit(server.app, int(engine.engine_max_body_mb * 2**20),
                    per_path={"/update_weights_from_tensor": weight_update.max_tensor_body(runner.model)})
    # web pages the user opens must not reach the admin endpoints (origin_guard.py)
    app = OriginGuard(app, serve.host, state_changing_get=lambda path: not auth.is_open_engine_path(path))
    http = guarded_protocol(int(engine.engine_max_header_kb * 1024), engine.engine_header_timeout)
    handed = take_handed_socket(serve.host, serve.port)  # the launcher's bound socket (held_port.py)
    if handed is None:
        uvicorn.run(app, host=serve.host, port=serve.port, log_level=serve.log_level, http=http)
    else:
        uvicorn.Server(uvicorn.Config(app, log_level=serve.log_level, http=http)).run(sockets=[handed])
    return 0


if __name__ == "__main__":
    from miles.config import run_main

    run_main(main, "miles engine")
