"""Protection of the loopback servers (engine, router, dashboard) from web pages the user opens.

A page in the user's browser can send "simple" cross-origin requests to 127.0.0.1 (a POST with
`Content-Type: text/plain` needs no preflight), and through DNS rebinding it can even read the
answers: the browser then believes 127.0.0.1 is `evil.example`. Two rules stop both, and neither
touches our own clients (httpx, curl, the router's proxy), which send no `Origin` and a loopback
`Host`:

- Host: a server bound to a loopback address answers only requests whose `Host` names a loopback
  address (`localhost`, 127.0.0.0/8, `::1`). A rebound page sends `Host: evil.example`. A server
  bound beyond loopback has a token and can be reached under any name, so it skips this rule.
- Origin: a state-changing request (any method but GET/HEAD/OPTIONS, or a GET to a path the server
  calls state-changing) is refused when it carries an `Origin` other than the server's own
  (`http://<Host>`), or a `Sec-Fetch-Site` other than `same-origin`/`none`. Browsers send `Origin`
  on every cross-origin POST, and `Sec-Fetch-Site` on every request.

Refusals are 403 with a JSON body naming the header. The same middleware applies the JSON
content-type rule of `content_type.py` (415).
"""
from __future__ import annotations

import functools
import ipaddress
import json
from typing import Callable
from urllib.parse import urlsplit

from miles.serving import content_type

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_ORIGIN_FETCH_SITES = frozenset({"same-origin", "none"})


def host_name(host_header: str) -> str:
    """The name part of a Host header value: `[::1]:80` -> `::1`, `localhost:30000` -> `localhost`."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


@functools.lru_cache(maxsize=256)  # the router asks on every proxied request, nearly always the same name
def is_loopback_name(name: str) -> bool:
    name = name.rstrip(".") if name.endswith("localhost.") else name
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: *.localhost never leaves the machine
        return True
    try:
        address = ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def refusal(headers: dict[str, str], method: str, path: str, check_host: bool,
            state_changing_get: Callable[[str], bool]) -> str | None:
    """Why this request is refused, or None. `headers` has lower-case names."""
    host = headers.get("host")
    if check_host and host is not None and not is_loopback_name(host_name(host)):
        return (f"Host {host!r} is not a loopback name; this server answers only requests addressed to "
                f"127.0.0.1 or localhost (a web page rebinding its own name to this machine is refused)")
    if method in SAFE_METHODS and not state_changing_get(path):
        return None
    origin = headers.get("origin")
    if origin is not None and not same_origin(origin, host):
        return (f"Origin {origin!r} is not this server's own; state-changing requests from web pages of "
                f"other sites are refused (scripts and curl send no Origin)")
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site.lower() not in SAME_ORIGIN_FETCH_SITES:
        return f"Sec-Fetch-Site {fetch_site!r}: state-changing requests from other sites are refused"
    return None


def same_origin(origin: str, host: str | None) -> bool:
    if host is None:
        return False
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.strip().lower()


_GUARD_HEADERS = (b"host", b"origin", b"sec-fetch-site") + content_type.HEADERS
# Verdicts are kept per distinct (method, path, guard headers): a client sends the same ones on every request,
# and working them out (a dict, the Host parse, the media type) was ~4% of the router's CPU per request.
# Heads longer than this are judged afresh, so a client cannot fill the cache with large values.
_CACHED_HEADER_BYTES = 512


def guard_answer(scope, check_host: bool, state_changing_get: Callable[[str], bool]) -> tuple[int, str] | None:
    """(status, reason) of a refused request: 403 by `refusal`, 415 by the JSON content-type rule; else None."""
    path = scope["path"]
    seen, size = [], len(path)
    for name, value in scope["headers"]:
        if name in _GUARD_HEADERS:
            if name == b"content-length":  # the rule reads only whether it is zero: one key for every size
                value = b"0" if value.strip() == b"0" else b"1"
            seen.append((name, value))
            size += len(value)
    if size > _CACHED_HEADER_BYTES:
        return _answer(scope["method"], path, check_host, state_changing_get, tuple(seen))
    return _cached_answer(scope["method"], path, check_host, state_changing_get, tuple(seen))


def _answer(method: str, path: str, check_host: bool, state_changing_get: Callable[[str], bool],
            seen: tuple[tuple[bytes, bytes], ...]) -> tuple[int, str] | None:
    headers = {name.decode(): value.decode("latin-1") for name, value in seen}
    reason = refusal(headers, method, path, check_host, state_changing_get)
    if reason is not None:
        return 403, reason
    reason = content_type.content_type_refusal(headers, method, path)
    return (415, reason) if reason is not None else None


_cached_answer = functools.lru_cache(maxsize=1024)(_answer)


class OriginGuard:
    """ASGI middleware applying `refusal` and the content-type rule to every HTTP request before `app` sees it."""

    def __init__(self, app, bound_host: str, state_changing_get: Callable[[str], bool] = lambda path: False):
        self.app = app
        self.check_host = is_loopback_name(host_name(bound_host) if bound_host.startswith("[") else bound_host)
        self.state_changing_get = state_changing_get

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            refused = guard_answer(scope, self.check_host, self.state_changing_get)
            if refused is not None:
                status, reason = refused
                body = json.dumps({"error": reason}).encode()
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", b"%d" % len(body))]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
