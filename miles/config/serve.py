"""Settings of the standalone servers: `miles engine` and `miles router`."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import ConfigError, flag

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class EngineServeConfig:
    """Where `miles engine` serves which checkpoint."""

    model: str | None = flag(None, "HF checkpoint directory to serve (default: the tiny base model, made if missing)",
                             existing_path=True)
    host: str = flag("127.0.0.1", "address to bind (loopback by default)")
    port: int = flag(30000, "port to bind", minimum=0, maximum=65535)
    weight_version: str = flag("default", "weight version the engine reports until the first weight update "
                                          "(SGLang's --weight-version)")
    log_level: str = flag("warning", "log level of the engine's HTTP server",
                          choices=("critical", "error", "warning", "info", "debug"))
    timeline_path: str | None = flag(None, "append the engine's decoding (one span per stretch of back-to-back batches) to this file (the run's "
                                           "RUN_DIR/timeline.jsonl; embedded engine only)")
    engine_index: int | None = flag(None, "the engine's index in the run's engine list, written on "
                                          "its timeline spans as its coordinate (a run's launcher "
                                          "passes it)", minimum=0)
    inject_slow_apply: str | None = flag(None, "test hook: SECONDS@VERSION sleeps SECONDS in the apply "
                                               "of every weight push from version VERSION on "
                                               "(--inject-fault slow-engine-apply passes it; "
                                               "embedded engine only)")
    engine_admin_token: str | None = flag(None, "token required by the engine's state-changing endpoints (weights, "
                                                "pause, abort, flush; env MILES_ENGINE_ADMIN_TOKEN); required off "
                                                "loopback", secret=True)


@dataclass(frozen=True)
class RouterServeConfig:
    """Where `miles router` listens and which workers it starts with."""

    host: str = flag("127.0.0.1", "address to bind (loopback by default)")
    port: int = flag(30100, "port to bind", minimum=0, maximum=65535)
    worker_urls: list[str] = flag([], "engine URLs to register at start-up")
    timeline_path: str | None = flag(None, "append the router's spans (one per burst of proxied requests, plus worker, "
                                           "weight-version and engine admin events) to this file (the run's "
                                           "RUN_DIR/timeline.jsonl)")

    def validate(self) -> None:
        for url in self.worker_urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError("--worker-urls", f"{url!r} is not an http(s) URL")
