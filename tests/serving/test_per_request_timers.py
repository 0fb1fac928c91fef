"""No timer is made per request on the hot path (each is a libuv handle under uvloop: together ~10% of the
router's CPU), and the timeouts they stood for still hold: a kept-alive server connection idle past
`timeout_keep_alive` is closed, and an upstream request times out at its own deadline even on a pooled
connection whose timer was armed for a longer one."""
from __future__ import annotations

import asyncio
import time

import pytest
import uvicorn
from uvicorn.server import ServerState

from miles.serving.limits import guarded_protocol
from miles.serving.upstream import Endpoint, UpstreamError, UpstreamPool


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the timers made, by the callback's class and name (asyncio's call_later goes
    through call_at)."""

    def __init__(self):
        super().__init__()
        self.timers: dict[str, int] = {}

    def call_at(self, when, callback, *args, context=None):
        owner = getattr(callback, "__self__", None)
        name = f"{type(owner).__name__}.{getattr(callback, '__name__', '?')}" if owner is not None else repr(callback)
        self.timers[name] = self.timers.get(name, 0) + 1
        return super().call_at(when, callback, *args, context=context)


def run_counting(coro_fn) -> tuple[object, dict[str, int]]:
    loop = CountingLoop()
    try:
        result = loop.run_until_complete(asyncio.wait_for(coro_fn(), 30))
    finally:
        loop.close()
    return result, loop.timers


async def small_app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def serve(keep_alive: float, head_timeout: float):
    config = uvicorn.Config(small_app, http=guarded_protocol(64 * 1024, head_timeout), lifespan="off",
                            log_level="warning", timeout_keep_alive=keep_alive)
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: config.http_protocol_class(config=config, server_state=state, app_state={}), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


KEEP_ALIVE = 1.5
REQUEST = b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def answer(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    return head + await reader.readexactly(2)


def test_a_kept_alive_connection_makes_no_timer_per_request_and_is_closed_once_idle():
    async def scenario():
        server, port = await serve(keep_alive=KEEP_ALIVE, head_timeout=0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(50):
            writer.write(REQUEST)
            assert (await answer(reader)).startswith(b"HTTP/1.1 200 OK")
        busy_for = 0.0
        for _ in range(5):  # requests 0.4 s apart: never idle for the keep-alive's 1.5 s, so it stays open
            await asyncio.sleep(0.4)
            writer.write(REQUEST)
            assert (await answer(reader)).endswith(b"{}")
            busy_for += 0.4
        idle_start = time.monotonic()
        assert await reader.read(1) == b""  # closed by the server once idle past the keep-alive
        idle = time.monotonic() - idle_start
        writer.close()
        server.close()
        return busy_for, idle
    (busy_for, idle), timers = run_counting(scenario)
    assert busy_for > KEEP_ALIVE  # open longer than the keep-alive, in use all along
    assert KEEP_ALIVE <= idle < KEEP_ALIVE + 0.2 + 2.0  # within one head-timer period of it (+ a busy machine)
    assert not [name for name in timers if name.endswith("timeout_keep_alive_handler")], timers
    assert sum(timers.values()) < 45, timers  # one head timer per period, not one per request (55 requests)


def test_a_pooled_upstream_connection_keeps_one_timer_and_a_shorter_timeout_still_fires():
    release = asyncio.Event()

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET /slow"):
                    await release.wait()  # never answers in time
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    async def scenario():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        endpoint = Endpoint.from_url(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        pool = UpstreamPool()
        try:
            for _ in range(50):
                assert (await pool.fetch(endpoint, "GET", "/fast", 60)).body == b"ok"
            started = time.monotonic()
            with pytest.raises(UpstreamError) as info:  # the same pooled connection, a 0.3 s timeout
                await pool.fetch(endpoint, "GET", "/slow", 0.3)
            assert info.value.timeout
            return time.monotonic() - started
        finally:
            release.set()
            pool.close()
            server.close()
            await server.wait_closed()
    took, timers = run_counting(scenario)
    assert took < 5.0  # at its own deadline, not the 60 s one the connection's timer was armed for
    per_connection = sum(n for name, n in timers.items() if name.startswith("Connection."))
    assert per_connection <= 3, timers  # not one per request (51 requests)
