"""The Host and Origin rules of `miles.serving.origin_guard` (probe H1), case by case."""
from __future__ import annotations

import pytest

from miles.serving import origin_guard
from miles.serving.origin_guard import host_name, is_loopback_name, refusal


@pytest.mark.parametrize("host,loopback", [
    ("127.0.0.1:30000", True), ("127.9.9.9", True), ("localhost:8300", True), ("LOCALHOST", True),
    ("[::1]:30000", True), ("[::ffff:127.0.0.1]:1", True), ("app.localhost:1", True),
    ("evil.example:30000", False), ("127.0.0.1.evil.example", False), ("0.0.0.0:1", False),
    ("10.0.0.1", False), ("[::]:1", False), ("", False), ("localhost.evil.example", False),
])
def test_loopback_hosts(host, loopback):
    assert is_loopback_name(host_name(host)) is loopback


def never(path: str) -> bool:
    return False


@pytest.mark.parametrize("headers,method,refused", [
    ({"host": "127.0.0.1:5"}, "POST", False),  # a script: no Origin
    ({}, "POST", False),  # HTTP/1.0 without Host
    ({"host": "127.0.0.1:5", "origin": "http://127.0.0.1:5"}, "POST", False),  # the server's own page
    ({"host": "127.0.0.1:5", "origin": "http://127.0.0.1:6"}, "POST", True),  # another local port
    ({"host": "127.0.0.1:5", "origin": "null"}, "POST", True),  # a sandboxed frame or a file:// page
    ({"host": "127.0.0.1:5", "origin": "http://evil.example"}, "DELETE", True),
    ({"host": "127.0.0.1:5", "origin": "http://evil.example"}, "GET", False),  # reads: the Host rule covers them
    ({"host": "127.0.0.1:5", "sec-fetch-site": "cross-site"}, "POST", True),
    ({"host": "127.0.0.1:5", "sec-fetch-site": "same-site"}, "POST", True),
    ({"host": "127.0.0.1:5", "sec-fetch-site": "same-origin"}, "POST", False),
    ({"host": "evil.example:5"}, "GET", True),
])
def test_origin_rule(headers, method, refused):
    assert (refusal(headers, method, "/x", True, never) is not None) is refused


def test_a_state_changing_get_gets_the_origin_rule():
    headers = {"host": "127.0.0.1:5", "sec-fetch-site": "cross-site"}
    assert refusal(headers, "GET", "/flush_cache", True, lambda path: path == "/flush_cache") is not None
    assert refusal(headers, "GET", "/health", True, lambda path: path == "/flush_cache") is None


def test_off_loopback_any_host_is_answered():
    assert refusal({"host": "trainer-node-3:30000"}, "GET", "/health", False, never) is None
    assert refusal({"host": "trainer-node-3:30000", "origin": "http://evil.example"}, "POST", "/x", False,
                   never) is not None


def guard_scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "method": method, "path": path, "headers": headers}


def test_guard_verdicts_are_kept_per_client_shape_and_judged_afresh_for_large_heads():
    """The router asks on every request, so verdicts are cached: one entry for a client whatever its body's
    size, a separate one for an empty body (the content-type rule differs), none for an oversized head."""
    origin_guard._cached_answer.cache_clear()
    page = [(b"host", b"127.0.0.1:30000"), (b"origin", b"http://127.0.0.1:30000"), (b"content-type", b"text/plain")]
    for size in (b"17", b"4096", b"123456"):
        verdict = origin_guard.guard_answer(guard_scope("POST", "/generate", page + [(b"content-length", size)]),
                                            True, never)
        assert verdict is not None and verdict[0] == 415
    assert origin_guard._cached_answer.cache_info().currsize == 1
    empty = origin_guard.guard_answer(guard_scope("POST", "/generate", page + [(b"content-length", b"0")]), True, never)
    assert empty is None  # no body: any type goes
    assert origin_guard._cached_answer.cache_info().currsize == 2
    rebound = [(b"host", b"evil.example" + b"x" * 600)]
    verdict = origin_guard.guard_answer(guard_scope("GET", "/health", rebound), True, never)
    assert verdict is not None and verdict[0] == 403 and "not a loopback name" in verdict[1]
    assert origin_guard._cached_answer.cache_info().currsize == 2  # judged, not kept
