"""Request limits the engine and the router share: header size and read time, body size.

`guarded_protocol` is uvicorn's httptools protocol with three more rules: the request head
(request line and headers) may hold at most `max_head_bytes` (else 431) and must arrive
within `head_timeout` seconds of its first byte (else 408); a body, once its head is in, must
keep arriving at `MIN_BODY_RATE` bytes/s or more over each `head_timeout` window (else 408: a
body trickled at 1 B/s held the connection open for good, R8b); each time the connection is
closed. `BodyLimit` wraps an ASGI app and answers 413 to a body over its limit, from the
Content-Length when there is one, else as the bytes arrive.
"""
from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from miles.serving.coalesce import CoalescingTransport

# The slowest a request body may arrive, averaged over each head-timeout window: 16 KiB/s lets a body of a few
# KiB take the whole window and a slow link (128 kbit/s) any size, and ends a trickle within one window.
MIN_BODY_RATE = 16 * 1024


def _response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason.encode(), len(body)) + body)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of the module's docstring; `guarded_protocol`
    makes a subclass with the two numbers set."""

    max_head_bytes: int
    head_timeout: float

    # One timer per connection, not per request: it fires every `head_timeout` seconds and refuses
    # the connection if a request head has been arriving for longer than that (cheap on the hot
    # path). The same timer ends a kept-alive connection idle past `timeout_keep_alive` (within one
    # period): uvicorn made and cancelled a timer per request for it, ~6% of the router's CPU under
    # uvloop.
    _idle_since: float | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        # a response's head and body in one send
        self.transport = CoalescingTransport(transport, self.loop)
        self._head_bytes = 0
        self._tail = b""
        # a connection that sends nothing counts too
        self._head_started: float | None = self.loop.time()
        self._refused = False
        # (start, bytes) of the body's window
        self._body_window: tuple[float, int] = (self.loop.time(), 0)
        self._head_timer = self.loop.call_later(self.head_timeout, self._check_head_time)

    def data_received(self, data: bytes) -> None:
        # Counted before parsing: a whole oversized head can arrive in one read, and parsed it
        # would already have started the request. One override, no per-callback hooks: a head may
        # be arriving unless a request's body is (uvicorn's cycle, until its message completes).
        if self._refused:
            return
        cycle = self.cycle
        if cycle is None or not cycle.more_body or cycle.response_complete:
            # the first byte of the next request on a kept-alive connection
            if self._head_started is None:
                self._head_started = self.loop.time()
            end = (self._tail + data if self._tail else data).find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end + 4 - len(self._tail)
            self._tail = data[-3:]  # the blank line that ends the head may straddle two reads
            if self._head_bytes > self.max_head_bytes:
                self._refuse(431, "Request Header Fields Too Large",
                             f"the request line and headers exceed {self.max_head_bytes} bytes")
                return
        else:  # the body of the current request: counted towards its window
            self._body_window = (self._body_window[0], self._body_window[1] + len(data))
        super().data_received(data)
        # a head completed: the next one starts from zero, its body's window now
        if self.cycle is not cycle:
            self._head_bytes, self._tail, self._head_started = 0, b"", None
            self._body_window = (self.loop.time(), 0)

    def connection_lost(self, exc) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None
        # a timer only uvicorn's own paths may still have set
        super()._unset_keepalive_if_required()

    def on_response_complete(self) -> None:
        # uvicorn's, with the keep-alive deadline kept as a time the head timer checks, not a timer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle_since = self.loop.time()

    def _cancel_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _check_head_time(self) -> None:
        self._head_timer = None
        if self._refused or self.transport.is_closing():
            return
        started = self._head_started
        now = self.loop.time()
        if started is not None and now - started >= self.head_timeout:
            self._refuse(408, "Request Timeout",
                         f"the request headers did not arrive within {self.head_timeout}s")
            return
        idle = self._idle_since
        if idle is not None and now - idle >= self.timeout_keep_alive:
            self._cancel_timer()
            self.transport.close()  # uvicorn's keep-alive timeout: idle since its last answer
            return
        wait = self.head_timeout if started is None else self.head_timeout - (now - started)
        if idle is not None:
            wait = min(wait, self.timeout_keep_alive - (now - idle))
        if self._body_arriving():
            if self._check_body_rate(now):
                return
            wait = min(wait, self.head_timeout - (now - self._body_window[0]))
        self._head_timer = self.loop.call_later(max(wait, 0.01), self._check_head_time)

    def _body_arriving(self) -> bool:
        cycle = self.cycle
        return cycle is not None and cycle.more_body and not cycle.response_complete

    def _check_body_rate(self, now: float) -> bool:
        """Refuse a body that fell under MIN_BODY_RATE over a whole window; True when refused. While
        the app does not take the body (reading paused: it is not the client's fault) the window
        restarts."""
        start, received = self._body_window
        if self.flow.read_paused:
            self._body_window = (now, 0)
            return False
        if now - start < self.head_timeout:
            return False
        if received < MIN_BODY_RATE * (now - start):
            self._refuse(408, "Request Timeout",
                         f"the request body arrived at {received / (now - start):.0f} bytes/s over "
                         f"{now - start:.1f}s; at least {MIN_BODY_RATE} bytes/s are needed")
            return True
        self._body_window = (now, 0)
        return False

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._refused = True
        self._cancel_timer()
        if not self.transport.is_closing():
            cycle = self.cycle
            if cycle is None or not cycle.response_started:  # else the answer has begun: only close
                self.transport.write(_response(status, reason, message))
            self.transport.close()



def guarded_protocol(max_head_bytes: int, head_timeout: float) -> type[HttpToolsProtocol]:
    """A uvicorn `http=` protocol class enforcing the two limits."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,),
                {"max_head_bytes": max_head_bytes, "head_timeout": head_timeout})


class BodyLimit:
    """ASGI middleware: reads the request body up to `max_bytes` (413 past it), then hands the app the whole
    body at once; a path in `per_path` has its own limit instead (the engine's weight push: the model's size)."""

    def __init__(self, app, max_bytes: int, per_path: dict[str, int] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.per_path = dict(per_path or {})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.per_path.get(scope["path"], self.max_bytes)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return await send_too_large(send, limit)
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body was read
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > limit:
                return await send_too_large(send, limit)
            if not message.get("more_body"):
                break
        body = {"type": "http.request", "body": b"".join(parts), "more_body": False}

        async def replay():
            nonlocal body
            if body is not None:
                message, body = body, None
                return message
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)


async def send_too_large(send, max_bytes: int) -> None:
    body = json.dumps({"error": f"the request body exceeds {max_bytes} bytes"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
