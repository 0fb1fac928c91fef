"""Serving a Router with uvicorn: in the foreground (the CLI) or in a background thread (the pipeline)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import uvicorn

from miles.config import RouterConfig
from miles.serving.held_port import PortUnavailable, hold_port, listen_on
from miles.serving.limits import guarded_protocol
from miles.config.secrets import resolve_admin_token
from miles.router.app import Router, check_bind

try:  # uvloop and httptools are pinned dependencies; the fallbacks keep the router working without them
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None
try:
    import httptools  # noqa: F401
    HTTP_IMPL = "httptools"
except ImportError:  # pragma: no cover
    HTTP_IMPL = "h11"


def bind_socket(host: str, port: int | None) -> socket.socket:
    """A listening socket on host:port (port 0 or None: one the OS picks)."""
    try:
        return listen_on(hold_port(host, port))
    except PortUnavailable as exc:
        raise OSError(f"router {exc}") from None


def http_protocol(config: RouterConfig):
    """httptools with the header size and read-time limits (h11, the fallback, has its own size limit)."""
    if HTTP_IMPL != "httptools":  # pragma: no cover
        return HTTP_IMPL
    return guarded_protocol(int(config.router_max_header_kb * 1024), config.router_header_timeout)


def uvicorn_server(router: Router) -> uvicorn.Server:
    config = uvicorn.Config(router, loop="none", http=http_protocol(router.config), lifespan="on", access_log=False,
                            log_level="warning", server_header=False, date_header=False,
                            timeout_keep_alive=75, backlog=2048, proxy_headers=False)
    return uvicorn.Server(config)


def new_event_loop() -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


def serve_forever(router: Router, sock: socket.socket) -> None:
    """Run in the foreground until SIGINT/SIGTERM (uvicorn installs the handlers in the main thread)."""
    loop = new_event_loop()
    try:
        loop.run_until_complete(uvicorn_server(router).serve(sockets=[sock]))
    finally:
        loop.close()


@dataclass
class RouterHandle:
    """A router running in this process; `stop()` shuts it down, `stats()` takes the per-iteration snapshot."""

    url: str
    port: int
    router: Router
    _server: uvicorn.Server = field(repr=False)
    _loop: asyncio.AbstractEventLoop = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    def stats(self, reset: bool = True) -> dict:
        """`router_*` figures since the previous call (run on the router's loop, so it is thread safe)."""
        async def take():
            return self.router.snapshot(reset=reset).as_metrics()
        return asyncio.run_coroutine_threadsafe(take(), self._loop).result(timeout=30)

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"router at {self.url} did not stop within {timeout}s")

    def __enter__(self) -> "RouterHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_router(config: RouterConfig, host: str = "127.0.0.1", port: int | None = None, worker_urls=(),
                 ready_timeout: float = 30.0, timeline_path: str | None = None) -> RouterHandle:
    """Run a router in a background thread with its own event loop; returns once it answers /router_health.
    `timeline_path`: the timeline file its spans go to (as `miles router --timeline-path`)."""
    check_bind(host, resolve_admin_token(config))
    router = Router(config, worker_urls, timeline_path=timeline_path)
    sock = bind_socket(host, port)
    bound_port = sock.getsockname()[1]
    router.listening.append((host, bound_port))
    server = uvicorn_server(router)
    loop = new_event_loop()
    failure: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
        except BaseException as exc:  # surfaced to the caller below if it happens before readiness
            failure.set_exception(exc)
        finally:
            sock.close()
            loop.close()

    thread = threading.Thread(target=run, name=f"miles-router-{bound_port}", daemon=True)
    thread.start()
    url_host = f"[{host}]" if ":" in host else host
    url = f"http://{url_host}:{bound_port}"
    wait_until_ready(url + "/router_health", ready_timeout, thread, failure)
    return RouterHandle(url, bound_port, router, server, loop, thread)


def wait_until_ready(health_url: str, timeout: float, thread: threading.Thread,
                     failure: concurrent.futures.Future) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if failure.done():
            raise RuntimeError(f"router failed to start: {failure.exception()!r}")
        if not thread.is_alive():
            raise RuntimeError("router thread exited before it answered")
        try:
            with urllib.request.urlopen(health_url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.02)  # poll interval of the readiness check, not a stand-in for it
    raise TimeoutError(f"router did not answer {health_url} within {timeout}s")
