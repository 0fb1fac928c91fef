"""In-process routers a test starts and the fixture stops: the one body of the router fixtures of
tests/router/ and tests/security/ (which differ only in their defaults)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from miles.config import RouterConfig
from miles.router import RouterHandle, start_router


@contextmanager
def router_factory() -> Iterator[Callable[..., RouterHandle]]:
    """Yields `start(worker_urls=(), timeline_path=None, **RouterConfig fields)`; every router started is
    stopped on exit."""
    handles: list[RouterHandle] = []

    def start(worker_urls=(), timeline_path=None, **fields) -> RouterHandle:
        handle = start_router(RouterConfig(**fields), worker_urls=worker_urls, timeline_path=timeline_path)
        handles.append(handle)
        return handle
    try:
        yield start
    finally:
        for handle in handles:
            handle.stop()
