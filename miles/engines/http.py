"""Small HTTP helpers the engine's route modules share: strict JSON bodies and SSE framing."""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from fastapi import Request

from miles.engines.sglang_request import RequestError

# Bodies past this are decoded (and checked) on a worker thread, not on the event loop: a 15 MB list of
# token ids takes about a second to decode and two more to check, and /health must answer meanwhile.
LARGE_BODY_BYTES = 256 * 1024
# One thread for them all: each decode competes with the event loop for the GIL, and four at once
# measured /health up to 1.1 s (one at a time: see the E8 probe's figures); big bodies queue here.
_large_body_thread = ThreadPoolExecutor(1, thread_name_prefix="engine-decode")


def _int(text: str) -> int:
    return int(text)


def _float(text: str) -> float:
    return float(text)


def _object(pairs: list) -> dict:
    return dict(pairs)


def decode_json(raw: bytes, share_gil: bool = False) -> Any:
    """The JSON value of a request body, or RequestError. `share_gil`: decode numbers and objects through
    Python hooks, so a thread decoding a huge body gives the event loop's thread its turns (the C decoder
    alone holds the GIL for the whole body); about 1.8x slower, so only for large bodies."""
    hooks = dict(parse_int=_int, parse_float=_float, object_pairs_hook=_object) if share_gil else {}
    try:
        return json.loads(raw, **hooks)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError("the request body nests JSON too deeply") from None


async def read_json(request: Request, then: Callable[[Any], Any] | None = None) -> Any:
    """The decoded body, passed through `then` (a check that may take long on a big body) if given;
    a large body is decoded and checked off the event loop."""
    raw = await request.body()
    if len(raw) <= LARGE_BODY_BYTES:
        value = decode_json(raw)
        return then(value) if then else value

    def work():
        value = decode_json(raw, share_gil=True)
        return then(value) if then else value

    return await asyncio.get_running_loop().run_in_executor(_large_body_thread, work)


def sse(payload: Any) -> str:
    """One server-sent event carrying a JSON payload."""
    return f"data: {json.dumps(payload)}\n\n"
