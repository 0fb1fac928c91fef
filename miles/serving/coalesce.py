"""One send per turn of the event loop: a transport wrapper that joins the writes made in one turn.

uvicorn writes a response's head and its body with two `transport.write` calls, and on an idle
socket each is its own `send` syscall and its own loopback packet that wakes the client twice.
For the router's small proxied answers those two syscalls were the largest single cost of a
request (py-spy: about a third of the router's CPU). Held until the loop's next turn, both leave
in one `send`; nothing waits longer than the current turn, so latency does not change.
"""
from __future__ import annotations

import asyncio

# Held bytes past this go out at once: a large body gains nothing from joining, and a producer writing many
# chunks in one turn must meet the transport's flow control (pause_writing) as it would unwrapped.
FLUSH_AT = 64 * 1024


class CoalescingTransport:
    """`transport` with `write` deferred to the end of the current loop turn and joined; the rest passes through.
    `close` writes what is held first; `abort` drops it, as the transport's own abort drops its buffer."""

    __slots__ = ("_transport", "_loop", "_held", "_size")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None
        self._size = 0

    def write(self, data) -> None:
        if not data:
            return
        if type(data) is not bytes:  # a bytearray or memoryview may change before the flush
            data = bytes(data)
        if self._held is None:
            self._held, self._size = [data], len(data)
            self._loop.call_soon(self.flush)
        else:
            self._held.append(data)
            self._size += len(data)
        if self._size >= FLUSH_AT:
            self.flush()

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        held, self._held, self._size = self._held, None, 0
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    # asked on every request (uvicorn, the proxy): plain methods, not the __getattr__ pass-through
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default=None):
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held, self._size = None, 0
        self._transport.abort()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)
