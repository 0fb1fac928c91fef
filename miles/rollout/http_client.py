"""The rollout's HTTP client: POST JSON to the router (or an engine) over pooled keep-alive connections.

A rollout sends hundreds of small /generate requests; httpx's AsyncClient spends about 5 ms of
interpreter time on each (measured: 175-186 short requests/s at 64 in flight against an engine that
answers 1,170-1,230/s to this client), which made the client, not the engine, the rollout's limit.
Plain-http URLs therefore go through the lean connection pool the router uses (`miles.serving.upstream`:
one asyncio protocol per connection feeding httptools); https URLs, which that pool does not speak,
keep httpx.
"""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import httpx

from miles.serving.upstream import Endpoint, UpstreamError, UpstreamPool


class PostFailed(Exception):
    """The request could not be sent or answered (connection refused or lost, timeout)."""


class LeanPoster:
    """POST JSON bodies to one http:// base URL, keep-alive connections reused across requests."""

    def __init__(self, base_url: str, timeout: float):
        self.endpoint = Endpoint.from_url(base_url)
        self.prefix = urlsplit(base_url).path.rstrip("/")
        self.timeout = timeout
        self.pool = UpstreamPool(connect_timeout=min(timeout, 30.0))

    def _request(self, path: str, body: bytes, headers: dict[str, str] | None) -> bytes:
        for key, value in (headers or {}).items():
            if any(c in f"{key}{value}" for c in "\r\n\0"):
                raise ValueError(f"header {key!r} holds a line break or NUL")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.endpoint.host_header.decode()}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n")
        return head.encode("latin-1") + body

    async def post(self, path: str, payload: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        request = self._request(path, json.dumps(payload).encode(), headers)
        for _ in range(2):  # a second go only when a pooled connection turned out closed (never reached the peer)
            conn = await self._acquire()
            try:
                await conn.send(request, self.timeout)
                parts = []
                while (chunk := await conn.read()) is not None:
                    parts.append(chunk)
                return conn.status, b"".join(parts)
            except UpstreamError as exc:
                if not (exc.reused and not conn.head_done):
                    raise PostFailed(f"POST {path}: {exc}") from None
            finally:
                self.pool.release(self.endpoint, conn)
        raise PostFailed(f"POST {path}: {self.endpoint.host}:{self.endpoint.port} keeps closing connections")

    async def _acquire(self):
        try:
            return await self.pool.acquire(self.endpoint)
        except UpstreamError as exc:
            raise PostFailed(str(exc)) from None

    async def aclose(self) -> None:
        self.pool.close()


class HttpxPoster:
    """The same interface over httpx, for https URLs."""

    def __init__(self, base_url: str, timeout: float, concurrency: int):
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.base_url = base_url.rstrip("/")
        self.client = httpx.AsyncClient(timeout=timeout, limits=limits)

    async def post(self, path: str, payload: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        try:
            response = await self.client.post(self.base_url + path, json=payload, headers=headers)
        except httpx.HTTPError as exc:
            raise PostFailed(f"POST {path}: {exc!r}") from None
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self.client.aclose()


def json_poster(base_url: str, timeout: float, concurrency: int) -> LeanPoster | HttpxPoster:
    """The lean client for http:// URLs, httpx for https://."""
    if urlsplit(base_url).scheme == "http":
        return LeanPoster(base_url, timeout)
    return HttpxPoster(base_url, timeout, concurrency)
