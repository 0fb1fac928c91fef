"""What the security probes share: the admin token of their engine and routers, a small /generate, and raw
bytes on a socket."""
from __future__ import annotations

import socket

import httpx

TOKEN = "probe-token"  # the engine and the routers share it, so an admin call through a router reaches the engine
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BATCH = 32  # the session engine's (tests/security/conftest.py)


def generate(url: str, text: str = "12+34=", max_new_tokens: int = 4, **params) -> httpx.Response:
    return httpx.post(url + "/generate", json={"text": text, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0.0, **params}}, timeout=120)


def raw_request(port: int, data: bytes, timeout: float = 30.0) -> bytes:
    """Send raw bytes to 127.0.0.1:port and read until the server closes (or answers and times out)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading all of it
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, socket.timeout):
            pass
    return b"".join(chunks)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])
