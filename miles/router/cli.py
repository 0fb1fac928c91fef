"""`miles router`: serve the router in the foreground until interrupted."""
from __future__ import annotations

import dataclasses
import logging

from miles.config import ConfigError, RouterConfig, RouterServeConfig, parse_sections
from miles.config.argv import print_settings
from miles.serving.held_port import take_handed_socket
from miles.serving.parent_watch import watch_parent
from miles.config.secrets import resolve_admin_token
from miles.router.app import Router, check_bind, is_own_address
from miles.router.server import bind_socket, serve_forever
from miles.router.workers import WorkerError


def main(argv: list[str] | None = None) -> int:
    watch_parent()  # launched by a trainer: die with it
    parsed = parse_sections([RouterServeConfig, RouterConfig], argv, prog="miles router",
                            description="Route SGLang-style requests across engines, with health checks and failover.")
    serve, config = parsed[RouterServeConfig], parsed[RouterConfig]
    # the first line of its log; the token (from the flag or the environment) shows as ***
    print_settings("router", serve, dataclasses.replace(config, router_admin_token=resolve_admin_token(config)))
    check_bind(serve.host, resolve_admin_token(config))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        router = Router(config, serve.worker_urls, timeline_path=serve.timeline_path)
    except WorkerError as exc:
        raise ConfigError("--worker-urls", str(exc)) from None
    except OSError as exc:  # the timeline file cannot be opened for appending
        raise ConfigError("--timeline-path", str(exc)) from None
    # the socket our launcher bound and handed over (held_port.py), else our own --port
    sock = take_handed_socket(serve.host, serve.port) or bind_socket(serve.host, serve.port)
    port = sock.getsockname()[1]
    router.listening.append((serve.host, port))
    check_not_itself(serve.worker_urls, router.listening)
    host = f"[{serve.host}]" if ":" in serve.host else serve.host
    # The one line a parent process reads to learn the port (with --port 0); the token is never printed.
    print(f"miles router listening on http://{host}:{port} (policy {config.router_policy}, "
          f"{len(serve.worker_urls)} workers)", flush=True)
    serve_forever(router, sock)
    return 0


def check_not_itself(worker_urls: list[str], listening: list[tuple[str, int]]) -> None:
    """The /add_worker rule at start-up: a worker URL that is this router's own address would send every
    request round in a loop (N10: it was taken, and quarantined only after three failed health checks)."""
    for url in worker_urls:
        if is_own_address(url, listening):
            raise ConfigError("--worker-urls", f"{url} is this router's own address (it listens on "
                                               f"{listening[0][0]}:{listening[0][1]}); it would send every "
                                               f"request round in a loop")


if __name__ == "__main__":
    from miles.config import run_main

    run_main(main, "miles router")
