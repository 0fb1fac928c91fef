"""A fast stub engine speaking the slice of SGLang's HTTP contract the router relies on (run as a process).

GET /health, GET /get_server_info (with `weight_version`), POST /update_weights_from_disk and GET
/get_weight_version (the version only, nothing loaded), POST /generate (small JSON, or SSE
with `"stream": true`), and test switches: `--generate-status 400` answers every /generate
with that status, `--delay` holds each /generate that long, POST /stub/unhealthy fails /health.
It is raw ASGI on uvicorn so the benchmark measures the router, not the stub.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys

import uvicorn


class StubEngine:
    def __init__(self, weight_version: str, generate_status: int, delay: float, stream_gap: float):
        self.weight_version = weight_version
        self.generate_status = generate_status
        self.delay = delay
        self.stream_gap = stream_gap
        self.healthy = True
        self.generated = 0
        self.paused: str | None = None  # the mode of the last /pause_generation, None after /continue_generation
        self.pid = os.getpid()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path, method = scope["path"], scope["method"]
        if path == "/generate" and method == "POST":
            await self.generate(body, send)
        elif path == "/health":
            await reply(send, 200 if self.healthy else 503, b"{}")
        elif path == "/get_server_info":
            await reply(send, 200, json.dumps({"weight_version": self.weight_version, "pid": self.pid}).encode())
        elif path == "/update_weights_from_disk" and method == "POST":
            self.weight_version = str(json.loads(body)["weight_version"])
            await reply(send, 200, json.dumps({"success": True, "message": "stub loaded nothing",
                                               "weight_version": self.weight_version}).encode())
        elif path == "/get_weight_version":
            await reply(send, 200, json.dumps({"weight_version": self.weight_version}).encode())
        elif path == "/pause_generation" and method == "POST":
            self.paused = (json.loads(body or b"{}") or {}).get("mode", "default")
            await reply(send, 200, json.dumps({"success": True, "num_paused_requests": 0}).encode())
        elif path == "/continue_generation" and method == "POST":
            self.paused = None
            await reply(send, 200, json.dumps({"success": True}).encode())
        elif path == "/stub/unhealthy" and method == "POST":
            self.healthy = False
            await reply(send, 200, b"{}")
        elif path == "/stub/stats":
            await reply(send, 200, json.dumps({"generated": self.generated, "paused": self.paused}).encode())
        elif path == "/echo":
            headers = {k.decode(): v.decode() for k, v in scope["headers"]}
            await reply(send, 200, json.dumps({"method": method, "query": scope["query_string"].decode(),
                                               "body": body.decode(), "headers": headers}).encode())
        else:
            await reply(send, 404, json.dumps({"error": f"stub has no {method} {path}"}).encode())

    async def generate(self, body: bytes, send) -> None:
        if self.generate_status != 200:
            await reply(send, self.generate_status, b'{"error": "stub told to fail"}')
            return
        request = json.loads(body) if body else {}
        if self.delay:
            await asyncio.sleep(self.delay)
        self.generated += 1
        if request.get("stream"):
            await self.stream(int(request.get("chunks", 5)), send)
            return
        await reply(send, 200, b'{"text": "42", "meta_info": {"id": "stub", "finish_reason": {"type": "stop"}, '
                               b'"completion_tokens": 2, "weight_version": "%s", "pid": %d}}'
                    % (self.weight_version.encode(), self.pid))

    async def stream(self, chunks: int, send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        for index in range(chunks):
            event = json.dumps({"text": str(index), "index": index})
            await send({"type": "http.response.body", "body": f"data: {event}\n\n".encode(), "more_body": True})
            await asyncio.sleep(self.stream_gap)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def reply(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--generate-status", type=int, default=200)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--stream-gap", type=float, default=0.01)
    args = parser.parse_args(argv)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(2048)
    print(f"stub engine listening on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    app = StubEngine(args.weight_version, args.generate_status, args.delay, args.stream_gap)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", lifespan="off", access_log=False,
                            log_level="warning", server_header=False, date_header=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
