"""The lean upstream client against a raw asyncio HTTP server: keep-alive reuse, framing, stale connections."""
from __future__ import annotations

import asyncio

import pytest

from miles.serving.upstream import Endpoint, UpstreamError, UpstreamPool


class RawServer:
    """Answers each request with `reply`; counts connections; can close idle ones."""

    def __init__(self, reply: bytes, close_after_reply: bool = False):
        self.reply = reply
        self.close_after_reply = close_after_reply
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(self.reply)
                await writer.drain()
                if self.close_after_reply:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def __aenter__(self) -> Endpoint:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return Endpoint.from_url(f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}")

    async def __aexit__(self, *exc) -> None:
        for writer in self.writers:
            writer.close()
        self.server.close()
        await self.server.wait_closed()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_keep_alive_means_one_connection_for_sequential_requests():
    server = RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async def scenario():
        async with server as endpoint:
            pool = UpstreamPool()
            results = [await pool.fetch(endpoint, "GET", "/x", 5) for _ in range(5)]
            pool.close()
            return results
    assert [(r.status, r.body) for r in run(scenario())] == [(200, b"ok")] * 5
    assert server.connections == 1


def test_chunked_and_close_delimited_bodies():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    unframed = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-close"

    async def scenario(reply, close):
        async with RawServer(reply, close_after_reply=close) as endpoint:
            pool = UpstreamPool()
            result = await pool.fetch(endpoint, "GET", "/", 5)
            pool.close()
            return result.body
    assert run(scenario(chunked, False)) == b"abcde"
    assert run(scenario(unframed, True)) == b"until-close"


def test_a_pooled_connection_closed_by_the_server_is_replaced_transparently():
    server = RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async def scenario():
        async with server as endpoint:
            pool = UpstreamPool()
            await pool.fetch(endpoint, "GET", "/", 5)
            for writer in server.writers:  # the server drops the idle keep-alive connection
                writer.close()
            # Whether or not the close has reached the pool yet, the next fetch must succeed.
            result = await pool.fetch(endpoint, "GET", "/", 5)
            pool.close()
            return result
    assert run(scenario()).body == b"ok"
    assert server.connections == 2


def test_timeouts_and_refusals_are_upstream_errors():
    async def silent(reader, writer):
        await reader.read(1000)
        await asyncio.sleep(10)

    async def scenario():
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        endpoint = Endpoint.from_url(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        pool = UpstreamPool()
        try:
            with pytest.raises(UpstreamError) as info:
                await pool.fetch(endpoint, "GET", "/", 0.2)
            assert info.value.timeout
        finally:
            pool.close()
            server.close()
        with pytest.raises(UpstreamError, match="cannot connect"):
            await UpstreamPool().fetch(endpoint, "GET", "/", 1)
    run(scenario())


class ClosedUnderUs:
    """A transport whose handle is already closed while it does not say it is closing yet: its write raises
    what uvloop raised in CI ("unable to perform operation on <TCPTransport closed=True ...>")."""

    def __init__(self, transport):
        self.transport = transport

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.transport.abort()
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True reading=False>; "
                           "the handler is closed")

    def __getattr__(self, name):
        return getattr(self.transport, name)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_send_on_a_connection_closed_under_it_is_a_retryable_upstream_error(loop):
    """A pooled connection whose transport closed before its connection_lost ran (a killed worker, a
    client-gone abort): uvloop raised RuntimeError from the write, which the router answered as a bare
    500 in the middle of a fault-tolerant run (CI, 2026-12-04). It is the "worker closed" error the proxy
    retries on a fresh connection."""
    import uvloop

    server = RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async def scenario():
        async with server as endpoint:
            pool = UpstreamPool()
            assert (await pool.fetch(endpoint, "GET", "/x", 5)).status == 200
            conn = await pool.acquire(endpoint)  # the pooled one, marked reused
            conn.transport = ClosedUnderUs(conn.transport)  # the handle closed, connection_lost not yet run
            with pytest.raises(UpstreamError) as raised:
                await conn.send(b"GET /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 5)
            pool.release(endpoint, conn)
            again = await pool.fetch(endpoint, "GET", "/x", 5)  # the next request dials a new connection
            pool.close()
            return raised.value, again
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        error, again = runner.run(asyncio.wait_for(scenario(), 30))
    assert error.reused and "closed" in str(error)
    assert (again.status, again.body) == (200, b"ok") and server.connections == 2
