"""The JSON content-type rule of the loopback servers (engine, router, dashboard), beside the Origin/Host guard.

A web page can send a "simple" cross-origin POST without a CORS preflight only with a body typed
`text/plain`, `multipart/form-data` or `application/x-www-form-urlencoded` (or a Blob with no type).
The servers' POST endpoints take JSON, so a request with a body must say so:

- `application/json` (or any `application/*+json`): accepted;
- no body (`Content-Length: 0`, or neither it nor `Transfer-Encoding`): accepted whatever the type
  (`/pause_generation`, `/add_worker?url=...`);
- `application/x-www-form-urlencoded` or no type at all: accepted only from a client that is not a
  browser (no `Origin`, no `Sec-Fetch-Site`: curl's `-d` labels JSON this way, scripts send no type);
- the trainer's in-memory weight push (`/update_weights_from_tensor`) is `application/octet-stream`;
- anything else (`text/plain`, `multipart/form-data`, ...): 415 naming the Content-Type.
"""
from __future__ import annotations

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Paths whose body is not JSON, and the one type each takes (what our own client sends).
BINARY_PATHS = {"/update_weights_from_tensor": "application/octet-stream"}
FORM = "application/x-www-form-urlencoded"
HEADERS = (b"content-type", b"content-length", b"transfer-encoding")  # what the rule reads, with the guard's


def media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def is_json_type(media: str) -> bool:
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def has_body(headers: dict[str, str]) -> bool:
    length = headers.get("content-length")
    if length is not None:
        return length.strip() != "0"
    return "transfer-encoding" in headers


def content_type_refusal(headers: dict[str, str], method: str, path: str) -> str | None:
    """Why this request's body type is refused (answer 415), or None. `headers` has lower-case names."""
    if method in SAFE_METHODS or not has_body(headers):
        return None
    given = headers.get("content-type")
    media = media_type(given) if given is not None else ""
    if is_json_type(media) or (path in BINARY_PATHS and media == BINARY_PATHS[path]):
        return None
    from_browser = "origin" in headers or "sec-fetch-site" in headers
    if media in (FORM, "") and not from_browser:
        return None
    wanted = BINARY_PATHS.get(path, "application/json")
    shown = repr(given) if given is not None else "missing"
    return (f"Content-Type {shown}: {method} {path} takes {wanted} (a body of another type is what a web page "
            f"can send across sites without a preflight, so it is refused)")
