"""A lean pooled HTTP/1.1 client for the proxy hot path: keep-alive connections per worker, bodies streamed.

General-purpose clients (httpx, aiohttp) spend most of a small request's time building
request/response objects; here one asyncio protocol per connection feeds httptools and
hands the proxy the status, the headers and body chunks as they arrive, nothing more.
It knows nothing about routing or retries: it reports what happened and the caller decides.
"""
from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

# Past this many unread body bytes the connection stops reading from the worker, so a
# slow client slows the stream down instead of growing the router's memory.
HIGH_WATER = 1 << 20
MAX_IDLE_PER_WORKER = 512


class UpstreamError(Exception):
    """The worker could not be reached, timed out, or spoke broken HTTP."""

    def __init__(self, message: str, *, reused: bool = False, timeout: bool = False):
        super().__init__(message)
        self.reused = reused  # failed on a pooled connection the worker may have closed meanwhile
        self.timeout = timeout


@dataclass(frozen=True)
class Endpoint:
    """Where a worker listens, parsed once from its URL."""

    host: str
    port: int
    host_header: bytes

    @classmethod
    def from_url(cls, url: str) -> "Endpoint":
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r}: the proxy speaks plain http to workers (http://host:port)")
        port = parts.port or 80
        return cls(parts.hostname, port, f"{parts.hostname}:{port}".encode())


@dataclass(frozen=True)
class FetchResult:
    """A whole response read by `UpstreamPool.fetch` (health checks, server info)."""

    status: int
    body: bytes


class Connection(asyncio.Protocol):
    """One keep-alive connection; serves one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.reused = False
        self.closed = False
        # The request timeout as a deadline, checked by one timer the connection keeps armed while busy: a
        # timer made and cancelled per request (a libuv handle each under uvloop) was ~3% of the router's CPU.
        self.deadline: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0  # when the armed timer fires
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.framed = False  # body length known from the headers (else it ends when the worker closes)
        self.content_length: int | None = None
        self.head_done = False
        self.head_only = False
        self.done = False
        self.keep_alive = False
        self.error: UpstreamError | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future | None = None
        self.deadline = None

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"bad HTTP from worker: {exc}"))
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._disarm()
        if self.head_done and not self.done and not self.framed:
            self.on_message_complete()  # a body delimited by the end of the connection
        elif not self.done:
            self._fail(UpstreamError(f"worker closed the connection ({exc or 'EOF'})", reused=self.reused))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self.framed = True
            self.content_length = int(value)  # the parser has checked it is digits
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            self.framed = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status in (204, 304) or 100 <= self.status < 200:
            self.framed = True
        self.head_done = True
        if self.head_only:  # a HEAD answer has no body whatever its headers say; the parser cannot know
            self.keep_alive = False
            self.done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        # httptools forgets keep-alive once the message is over, so it is read here.
        self.keep_alive = self.parser.should_keep_alive()
        self.done = True
        self.deadline = None
        self._wake()

    # request side
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _arm(self, timeout: float) -> None:
        self.deadline = deadline = self.loop.time() + timeout
        if self.timer is not None and self.timer_at <= deadline:
            return  # it fires first and then waits on for this deadline
        if self.timer is not None:  # armed for a later deadline (a longer timeout before): sooner now
            self.timer.cancel()
        self.timer, self.timer_at = self.loop.call_at(deadline, self._check_deadline), deadline

    def _check_deadline(self) -> None:
        """The timer fired: past the current request's deadline, it timed out; before it (the timer was armed
        for an earlier request), it waits for that deadline; with no request in flight it is not re-armed."""
        self.timer = None
        if self.deadline is None:
            return
        if self.loop.time() >= self.deadline:
            self.deadline = None
            self._fail(UpstreamError("worker timed out", timeout=True))
            self.abort()
        else:
            self.timer, self.timer_at = self.loop.call_at(self.deadline, self._check_deadline), self.deadline

    def _disarm(self) -> None:
        self.deadline = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def abort(self) -> None:
        self.closed = True
        self._disarm()
        if self.transport is not None:
            self.transport.abort()

    async def _wait(self) -> None:
        self.waiter = waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    async def send(self, request: bytes, timeout: float, head_only: bool = False) -> None:
        """Write a serialized request and wait for the response head (status and headers)."""
        self.head_only = head_only
        # a pooled connection the worker (or a client-gone abort) closed before its connection_lost ran:
        # uvloop raises RuntimeError on the write, which must be the retryable "worker closed" and not a 500
        if self.closed or self.transport.is_closing():
            raise self.error or UpstreamError("worker closed the connection", reused=self.reused)
        self._arm(timeout)
        try:
            self.transport.write(request)
        except RuntimeError as exc:  # uvloop: "unable to perform operation on <TCPTransport closed=True ...>"
            raise UpstreamError(f"worker closed the connection ({exc})", reused=self.reused) from None
        while not self.head_done:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def read(self) -> bytes | None:
        """The body bytes that arrived since the last call (waiting for some); None once the body ended."""
        while not self.chunks:
            if self.done:
                return None
            if self.error is not None:
                raise self.error
            await self._wait()
        data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        return data

    @property
    def finished(self) -> bool:
        """The whole response is in hand (nothing left to wait for)."""
        return self.done

    def reusable(self) -> bool:
        return self.done and self.keep_alive and not self.closed and self.error is None


class UpstreamPool:
    """Idle keep-alive connections per worker endpoint; `acquire` reuses one or dials a new one."""

    def __init__(self, connect_timeout: float = 10.0):
        self.connect_timeout = connect_timeout
        self._idle: dict[Endpoint, list[Connection]] = {}

    def take_idle(self, endpoint: Endpoint) -> Connection | None:
        """A pooled connection to `endpoint`, or None (then `dial` one): no coroutine when one is idle."""
        idle = self._idle.get(endpoint)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        return None

    async def acquire(self, endpoint: Endpoint) -> Connection:
        return self.take_idle(endpoint) or await self.dial(endpoint)

    async def dial(self, endpoint: Endpoint) -> Connection:
        """A new connection to `endpoint`."""
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: Connection(loop), endpoint.host, endpoint.port),
                self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {endpoint.host}:{endpoint.port}: {exc or 'timed out'}",
                                timeout=isinstance(exc, asyncio.TimeoutError)) from None
        return conn

    def release(self, endpoint: Endpoint, conn: Connection) -> None:
        """Back to the pool if the response was read to the end on a live connection; else closed."""
        conn.deadline = None  # its timer, if armed, lapses on its own (no handle made or dropped per request)
        if conn.reusable():
            idle = self._idle.setdefault(endpoint, [])
            if len(idle) < MAX_IDLE_PER_WORKER:
                conn._reset()
                idle.append(conn)
                return
        conn.abort()

    def forget(self, endpoint: Endpoint) -> None:
        """Close the idle connections to a worker (removed, or found dead)."""
        for conn in self._idle.pop(endpoint, []):
            conn.abort()

    def close(self) -> None:
        for endpoint in list(self._idle):
            self.forget(endpoint)

    async def fetch(self, endpoint: Endpoint, method: str, path: str, timeout: float) -> FetchResult:
        """One small request read whole, for health checks and server info (not the proxy path)."""
        request = (f"{method} {path} HTTP/1.1\r\nHost: {endpoint.host_header.decode()}\r\n"
                   f"Content-Length: 0\r\n\r\n").encode()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for _ in range(2):  # a second go only when a pooled connection turned out to be closed
            conn = await self.acquire(endpoint)
            try:
                await conn.send(request, max(deadline - loop.time(), 0.001))
                parts = []
                while (chunk := await conn.read()) is not None:
                    parts.append(chunk)
                return FetchResult(conn.status, b"".join(parts))
            except UpstreamError as exc:
                if not exc.reused:
                    raise
            finally:
                self.release(endpoint, conn)
        raise UpstreamError(f"{endpoint.host}:{endpoint.port} keeps closing connections")
