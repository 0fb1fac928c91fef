"""The proxy hot path as a raw ASGI handler: pick a worker, forward, pass the answer back as it arrives.

Failover happens only before the first byte reaches the client: a connection error, a
timeout or a 5xx is retried on another worker after a bounded, jittered backoff; a 4xx
is the client's problem and passes through untouched. Bodies are never parsed.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass

from miles.router.stats import RouterStats
from miles.serving.upstream import Connection, UpstreamError, UpstreamPool
from miles.router.workers import Worker, WorkerPool

log = logging.getLogger(__name__)

# Never forwarded: they describe one hop, or the proxy sets them itself.
REQUEST_SKIP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te",
                          b"trailer", b"upgrade", b"host", b"content-length", b"expect", b"proxy-authorization"})
RESPONSE_SKIP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te",
                           b"trailer", b"upgrade"})
# A response up to this size with a known length is read whole before the client sees a byte, so a
# worker dying mid-body can still be failed over; anything larger or unframed (SSE) is streamed.
SMALL_BODY = 256 * 1024
MAX_BACKOFF_S = 2.0
# SGLang's gateway header for session affinity: all requests with one key go to one worker.
ROUTING_KEY_HEADER = b"x-smg-routing-key"
# Each router appends its id to this header on the way to a worker; seeing its own id again means the
# request went round a loop (a router registered behind itself), answered 508 instead of recursing.
HOP_HEADER = b"x-miles-router-hop"
WATCH_AFTER_S = 0.05  # a request answered sooner never starts a disconnect watch


@dataclass(frozen=True)
class Outcome:
    """How one attempt on one worker ended."""

    delivered: bool        # the client got a response (nothing more to try)
    failed: bool = False   # ... and it counts as a failure (5xx, or cut mid-stream)
    error: str | None = None


DELIVERED_OK = Outcome(delivered=True)
DELIVERED_FAILED = Outcome(delivered=True, failed=True)


class ClientGone(Exception):
    """The client disconnected before its request body was read."""


class BodyTooLarge(Exception):
    """The request body passed the router's limit."""


class LoopDetected(Exception):
    """The request already went through this router."""


class ClientWatch:
    """Waits for the client to disconnect while its request is served, and then aborts the worker
    connection in use, so the engine sees the disconnect and stops decoding for nobody.

    The proxy starts the watching task only once a request has taken `WATCH_AFTER_S` (most answers
    come sooner; a task per request would cost the hot path more than the proxying). A client that
    left earlier is noticed then: its disconnect waits in `receive`."""

    __slots__ = ("conn", "gone", "receive", "since", "task")

    def __init__(self, receive, since: float):
        self.conn: Connection | None = None
        self.gone = False
        self.receive = receive
        self.since = since
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self.conn is not None:
            self.conn.abort()

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()


class Proxy:
    """Forwards every request it is given to a worker chosen by the pool."""

    def __init__(self, pool: WorkerPool, upstream: UpstreamPool, stats: RouterStats, *, max_retries: int,
                 retry_backoff: float, request_timeout: float, rng: random.Random | None = None,
                 max_body_bytes: int = 16 * 2**20, hop_id: bytes = b"router"):
        self.max_body_bytes = max_body_bytes
        self.hop_id = hop_id
        self.pool = pool
        self.upstream = upstream
        self.stats = stats
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.request_timeout = request_timeout
        self.rng = rng or random.Random()
        self._unwatched: dict[ClientWatch, None] = {}  # in arrival order; the sweeper starts the old ones
        self._sweeper: asyncio.Task | None = None

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(WATCH_AFTER_S)
            due = time.perf_counter() - WATCH_AFTER_S
            for watch in list(self._unwatched):
                if watch.since > due:
                    break
                del self._unwatched[watch]
                watch.start()

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1-based): exponential, capped, jittered +-50%."""
        return min(self.retry_backoff * 2 ** (retry - 1), MAX_BACKOFF_S) * self.rng.uniform(0.5, 1.5)

    async def __call__(self, scope, receive, send) -> None:
        try:
            head, routing_key = request_head(scope, self.hop_id, self.max_body_bytes)
            body = await read_body(receive, self.max_body_bytes)
        except ClientGone:
            return
        except BodyTooLarge:
            await send_json(send, 413, {"error": f"the request body exceeds {self.max_body_bytes} bytes"})
            return
        except LoopDetected:
            await send_json(send, 508, {"error": "loop detected: this request already went through this router "
                                                 "(is the router registered as its own worker?)"})
            return
        start = time.perf_counter()
        watch = ClientWatch(receive, start)
        self._unwatched[watch] = None
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
        try:
            await self.forward(scope, head, body, watch, send, start, routing_key)
        finally:
            self._unwatched.pop(watch, None)
            watch.close()

    async def forward(self, scope, head: bytes, body: bytes, watch: ClientWatch, send, start: float,
                      routing_key: bytes | None = None) -> None:
        tried: list[Worker] = []
        retries = 0
        error: str | None = None
        while True:
            worker = self.pool.choose(tried, routing_key)
            if worker is None:
                self.stats.record_no_worker()
                await send_json(send, 503, {"error": self.no_worker_message(), "last_error": error})
                return
            attempt_start = time.perf_counter()
            worker.inflight += 1
            try:
                outcome = await self.attempt(worker, head, body, scope, watch, send,
                                             may_retry=retries < self.max_retries)
            finally:
                worker.inflight -= 1
            if watch.gone:
                return  # the client left: nothing to answer, and not the worker's fault
            now = time.perf_counter()
            worker.observe(now - attempt_start, outcome.failed or not outcome.delivered)
            if outcome.delivered:
                self.stats.record(now - start, outcome.failed, retries)
                return
            error = f"{worker.url}: {outcome.error}"
            if retries >= self.max_retries:
                self.stats.record(now - start, True, retries)
                await send_json(send, 502, {"error": f"no worker answered after {retries + 1} attempts",
                                            "last_error": error})
                return
            tried.append(worker)
            retries += 1
            await asyncio.sleep(self.backoff(retries))

    def no_worker_message(self) -> str:
        registered = len(self.pool.urls)
        if not registered:
            return "no healthy worker: none registered (POST /add_worker)"
        return f"no healthy worker: all {registered} registered workers are quarantined"

    async def attempt(self, worker: Worker, head: bytes, body: bytes, scope, watch: ClientWatch, send,
                      may_retry: bool) -> Outcome:
        endpoint = worker.endpoint
        request = b"%sHost: %s\r\nContent-Length: %d\r\n\r\n%s" % (head, endpoint.host_header, len(body), body)
        head_only = scope["method"] == "HEAD"
        for _ in range(2):  # a second go only when a pooled connection turned out to be closed
            conn = self.upstream.take_idle(endpoint)
            if conn is None:
                try:
                    conn = await self.upstream.dial(endpoint)
                except UpstreamError as exc:
                    return Outcome(delivered=False, error=str(exc))
            watch.conn = conn
            if watch.gone:
                conn.abort()
            try:
                await conn.send(request, self.request_timeout, head_only)
                break
            except UpstreamError as exc:
                self.upstream.release(endpoint, conn)
                if not exc.reused:
                    return Outcome(delivered=False, error=str(exc))
        else:
            return Outcome(delivered=False, error="worker keeps closing connections")
        try:
            return await self.relay(conn, send, watch, may_retry)
        finally:
            watch.conn = None
            self.upstream.release(endpoint, conn)

    async def relay(self, conn: Connection, send, watch: ClientWatch, may_retry: bool) -> Outcome:
        status = conn.status
        if status >= 500 and may_retry:
            return Outcome(delivered=False, error=f"answered HTTP {status}")
        headers = [(name, value) for name, value in conn.headers if name not in RESPONSE_SKIP]
        failed = status >= 500
        if _small_body(conn):
            try:
                parts = []
                while (chunk := await conn.read()) is not None:
                    parts.append(chunk)
            except UpstreamError as exc:
                return Outcome(delivered=False, error=str(exc))
            self.stats.record_first_chunk(time.perf_counter() - watch.since)
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": parts[0] if len(parts) == 1 else b"".join(parts)})
            return DELIVERED_FAILED if failed else DELIVERED_OK
        await send({"type": "http.response.start", "status": status, "headers": headers})
        first = True
        try:
            while (chunk := await conn.read()) is not None:
                if first:  # a stream's first token(s): the client-side time to first token
                    self.stats.record_first_chunk(time.perf_counter() - watch.since)
                    first = False
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError as exc:
            if watch.gone:
                return DELIVERED_OK  # the client left; not the worker's fault
            log.warning("stream from worker broke after the response started: %s", exc)
            raise
        await send({"type": "http.response.body", "body": b""})
        return DELIVERED_FAILED if failed else DELIVERED_OK


def _small_body(conn: Connection) -> bool:
    """Read whole before answering (so a failure mid-body can still fail over): only a body whose
    Content-Length is known and small. Chunked and unframed bodies (SSE streams) pass through as they come."""
    if not conn.framed:
        return False
    if conn.content_length is not None:
        return conn.content_length <= SMALL_BODY
    status = conn.status
    return status in (204, 304) or status < 200  # framed without a length: no body, or chunked


async def read_body(receive, max_bytes: int) -> bytes:
    """The whole request body (up to `max_bytes`); kept because a failover resends it to another worker."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body = message.get("body", b"")
    if len(body) > max_bytes:
        raise BodyTooLarge
    if not message.get("more_body"):
        return body
    parts, size = [body], len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        parts.append(message.get("body", b""))
        size += len(parts[-1])
        if size > max_bytes:
            raise BodyTooLarge
        if not message.get("more_body"):
            return b"".join(parts)


def request_head(scope, hop_id: bytes, max_body_bytes: int) -> tuple[bytes, bytes | None]:
    """Request line and forwarded headers with this router's hop id, ending before Host/Content-Length
    (added per worker), and the routing key (SGLang's affinity header) if one was sent. Raises
    LoopDetected if the request went through this router already, and BodyTooLarge when its
    Content-Length says so (before a byte of the body is read)."""
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    lines = [b"%s %s HTTP/1.1\r\n" % (scope["method"].encode(), target)]
    hops = hop_id
    routing_key, keyed = None, False
    for name, value in scope["headers"]:
        if name not in REQUEST_SKIP:
            if name == ROUTING_KEY_HEADER and not keyed:  # the first one counts
                routing_key, keyed = value or None, True
            elif name == HOP_HEADER:
                if hop_id in value.split(b","):
                    raise LoopDetected
                hops = value + b"," + hop_id
                continue
            lines.append(b"%s: %s\r\n" % (name, value))
        elif name == b"content-length" and value.isdigit() and int(value) > max_body_bytes:
            raise BodyTooLarge
    lines.append(b"%s: %s\r\n" % (HOP_HEADER, hops))
    return b"".join(lines), routing_key


async def send_json(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})
