"""The servers' transport sends a response's head and body in one write (uvicorn writes them apart), and
never reorders, loses or delays a write past the current loop turn."""
from __future__ import annotations

import asyncio

import pytest
import uvicorn
from uvicorn.server import ServerState

from miles.serving.coalesce import FLUSH_AT, CoalescingTransport
from miles.serving.limits import guarded_protocol


class RecordingTransport(asyncio.Transport):
    """What the socket would have been asked to send, one entry per write."""

    def __init__(self):
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def one_turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def test_writes_of_one_turn_leave_as_one_in_order():
    asyncio.run(_writes_of_one_turn_leave_as_one_in_order())


async def _writes_of_one_turn_leave_as_one_in_order():
    raw = RecordingTransport()
    transport = CoalescingTransport(raw, asyncio.get_running_loop())
    transport.write(b"head;")
    transport.write(bytearray(b"body"))
    transport.write(b"")
    assert raw.writes == [] and transport.get_write_buffer_size() == 9
    await one_turn()
    assert raw.writes == [b"head;body"]
    transport.write(b"next")
    await one_turn()
    assert raw.writes == [b"head;body", b"next"]


def test_close_sends_what_is_held_and_abort_drops_it():
    asyncio.run(_close_sends_what_is_held_and_abort_drops_it())


async def _close_sends_what_is_held_and_abort_drops_it():
    raw = RecordingTransport()
    transport = CoalescingTransport(raw, asyncio.get_running_loop())
    transport.write(b"answer")
    transport.close()
    assert raw.writes == [b"answer"] and raw.closed
    raw2 = RecordingTransport()
    transport = CoalescingTransport(raw2, asyncio.get_running_loop())
    transport.write(b"answer")
    transport.abort()
    await one_turn()
    assert raw2.writes == [] and raw2.aborted


def test_a_large_write_goes_out_at_once():
    asyncio.run(_a_large_write_goes_out_at_once())


async def _a_large_write_goes_out_at_once():
    raw = RecordingTransport()
    transport = CoalescingTransport(raw, asyncio.get_running_loop())
    transport.write(b"h")
    transport.write(b"x" * FLUSH_AT)
    assert raw.writes == [b"h" + b"x" * FLUSH_AT]  # no waiting for the turn's end: flow control sees it now
    await one_turn()
    assert len(raw.writes) == 1


async def small_app(scope, receive, send) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"12")]})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})


@pytest.mark.parametrize("requests", [1, 3])
def test_the_servers_protocol_answers_a_small_request_in_one_write(requests):
    asyncio.run(_the_servers_protocol_answers_a_small_request_in_one_write(requests))


async def _the_servers_protocol_answers_a_small_request_in_one_write(requests):
    """The router, the engine and the dashboard serve with `guarded_protocol`: each answer is one write."""
    config = uvicorn.Config(small_app, http=guarded_protocol(64 * 1024, 10.0), lifespan="off", log_level="warning",
                            server_header=False, date_header=False)
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    raw = RecordingTransport()
    protocol.connection_made(raw)
    for _ in range(requests):
        before = len(raw.writes)
        protocol.data_received(b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        for _ in range(20):
            if len(raw.writes) > before:
                break
            await asyncio.sleep(0)
        await one_turn()
        assert len(raw.writes) == before + 1, raw.writes[before:]
        assert raw.writes[-1].startswith(b"HTTP/1.1 200 OK\r\n") and raw.writes[-1].endswith(b'\r\n\r\n{"ok": true}')
    protocol.connection_lost(None)
