"""The admin-token rule the router and the engine share: who may call a state-changing endpoint.

A server bound beyond loopback refuses to start without a token; once a token is set,
every admin endpoint needs `Authorization: Bearer <token>` (or `X-Admin-Token`), compared
in constant time. Endpoints that only generate or read are open.
"""
from __future__ import annotations

import hmac
import ipaddress

from miles.config import ConfigError

# Engine endpoints anyone who can reach the router or the engine may call: generation and reads.
OPEN_ENGINE_PATHS = frozenset({"/generate", "/health", "/health_generate", "/get_model_info", "/get_server_info",
                               "/get_weight_version", "/metrics"})
OPEN_ENGINE_PREFIXES = ("/v1/",)  # the OpenAI-compatible routes


class Unauthorized(Exception):
    """An admin endpoint was called without the right token."""


def is_open_engine_path(path: str) -> bool:
    return path in OPEN_ENGINE_PATHS or path.startswith(OPEN_ENGINE_PREFIXES)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_token_off_loopback(host: str, token: str | None, flag: str, env: str, what: str) -> None:
    """Refuse to serve admin endpoints beyond loopback without a token (ConfigError naming `flag`)."""
    if not is_loopback(host) and not token:
        raise ConfigError(flag, f"required when binding to {host} (not loopback): set the flag or {env} so "
                                f"{what} are not open to the network")


def bearer(token: str | None) -> dict[str, str]:
    """The header a client sends to an admin endpoint: `Authorization: Bearer <token>`; none without a token."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def given_token(headers) -> str:
    """The token a request carries: `Authorization: Bearer ...`, else `X-Admin-Token`.
    `headers` is a mapping with lower-case keys (Starlette's Headers, or a dict built from an ASGI scope)."""
    auth = headers.get("authorization") or ""
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-admin-token") or ""


def check_token(headers, token: str | None) -> None:
    """Raise Unauthorized unless no token is set or the request carries the right one."""
    if not token:
        return
    if not hmac.compare_digest(given_token(headers).encode("utf-8", "surrogateescape"), token.encode()):
        raise Unauthorized("admin token missing or wrong (send Authorization: Bearer <token>)")


def scope_headers(scope) -> dict[str, str]:
    """The request headers of an ASGI scope as a lower-case str dict (the last of repeated names wins)."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
