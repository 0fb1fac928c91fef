"""Probes R6-R8, E8: oversized bodies, prompts and headers, and slow headers, fail alone and fast."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from .probes import generate, port_of, raw_request


@pytest.mark.parametrize("target", ["engine", "router"])
def test_body_over_the_limit_is_413(engine, router, target):
    url = engine.url if target == "engine" else router().url
    body = json.dumps({"text": "1" * (20 * 2**20)})  # 20 MiB > the 16 MiB default
    r = httpx.post(url + "/generate", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and "exceeds" in r.text
    # chunked (no Content-Length): refused as the bytes arrive
    r = httpx.post(url + "/generate", content=iter([body.encode()[i:i + 2**20] for i in range(0, len(body), 2**20)]),
                   timeout=60)
    assert r.status_code == 413
    assert generate(url).status_code == 200


def test_a_long_prompt_is_refused_before_tokenizing_without_blocking_health(engine, router):
    url = router().url
    statuses, health_times = [], []

    def big():
        statuses.append(httpx.post(url + "/generate", json={"text": "1" * 5_000_000}, timeout=60).status_code)
    thread = threading.Thread(target=big)
    thread.start()
    while thread.is_alive():
        t = time.perf_counter()
        assert httpx.get(engine.url + "/health", timeout=5).status_code == 200  # under the router's health timeout
        health_times.append(time.perf_counter() - t)
    thread.join()
    assert statuses == [400]
    r = generate(engine.url, text="1" * 5_000_000)
    assert r.status_code == 400 and "context length" in r.json()["message"]


@pytest.mark.parametrize("target", ["engine", "router"])
def test_oversized_headers_are_431(engine, router, target):
    url = engine.url if target == "engine" else router().url
    r = httpx.get(url + "/health", headers={"x-big": "a" * 200_000}, timeout=30)
    assert r.status_code == 431
    many = raw_request(port_of(url), b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"x-h: 1\r\n" * 20_000 + b"\r\n")
    assert many.startswith(b"HTTP/1.1 431")
    # a whole head just over the limit in one write (one read on the server) is refused too
    one_read = raw_request(port_of(url), b"GET /health HTTP/1.1\r\nHost: x\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n")
    assert one_read.startswith(b"HTTP/1.1 431")
    assert httpx.get(url + "/health", timeout=30).status_code == 200


@pytest.mark.parametrize("target", ["engine", "router"])
def test_slow_headers_time_out_and_others_are_served(engine, router, target):
    handle = router(router_header_timeout=1.0) if target == "router" else None
    url = handle.url if handle else engine.url
    timeout = 1.0 if handle else 2.0  # the session engine runs with --engine-header-timeout 2
    with socket.create_connection(("127.0.0.1", port_of(url)), timeout=timeout + 20) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        started = time.monotonic()
        assert httpx.get(url + "/health", timeout=10).status_code == 200  # others unaffected
        answer = b""
        while True:  # one header byte per 0.2 s, like a slowloris, until the server closes
            try:
                sock.sendall(b"x")
                chunk = sock.recv(4096) if answer == b"" and _readable(sock) else b""
            except (BrokenPipeError, ConnectionResetError):
                break
            answer += chunk
            if answer:
                break
            assert time.monotonic() - started < timeout + 15, "the slow connection was never closed"
            time.sleep(0.2)
    assert answer.startswith(b"HTTP/1.1 408") or answer == b""


def _readable(sock: socket.socket) -> bool:
    import select

    return bool(select.select([sock], [], [], 0)[0])


@pytest.mark.parametrize("target", ["engine", "router"])
def test_a_trickled_body_is_cut_off_and_others_are_served(engine, router, target):
    """R8b: headers complete, then the body trickles (1 byte per 0.2 s of a declared 1000): the connection is
    answered 408 and closed within about two head-timeout windows, not held open for good."""
    handle = router(router_header_timeout=1.0) if target == "router" else None
    url = handle.url if handle else engine.url
    timeout = 1.0 if handle else 2.0  # the session engine runs with --engine-header-timeout 2
    head = (b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{")
    with socket.create_connection(("127.0.0.1", port_of(url)), timeout=timeout + 20) as sock:
        sock.sendall(head)
        started = time.monotonic()
        assert httpx.get(url + "/health", timeout=10).status_code == 200  # others unaffected
        answer = b""
        while True:
            try:
                sock.sendall(b" ")
                chunk = sock.recv(4096) if _readable(sock) else b""
            except (BrokenPipeError, ConnectionResetError):
                break
            answer += chunk
            if answer:
                break
            assert time.monotonic() - started < 2 * timeout + 15, "the trickling body was never cut off"
            time.sleep(0.2)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408") or answer == b"", answer[:200]
    assert b"bytes/s" in answer or answer == b""
    assert waited >= timeout * 0.9  # judged over a whole window, not at the first slow read


def test_a_body_that_arrives_at_a_normal_pace_is_served(engine, router):
    """A body sent in pieces but at a normal rate (64 KiB in 0.1 s steps over ~1.6 s, past the 1 s window)
    is read whole and answered (here 400: not a generate request), not cut off."""
    handle = router(router_header_timeout=1.0)
    body = b'{"text": "' + b"a" * (64 * 1024) + b'", "bogus_field_for_400": 1}'
    head = (b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
    with socket.create_connection(("127.0.0.1", port_of(handle.url)), timeout=60) as sock:
        sock.sendall(head)
        step = len(body) // 16 + 1
        for i in range(0, len(body), step):
            sock.sendall(body[i:i + step])
            time.sleep(0.1)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 ") and not answer.startswith(b"HTTP/1.1 408"), answer[:300]
