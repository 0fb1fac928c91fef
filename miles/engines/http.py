"""Small HTTP helpers the engine's route modules share: strict JSON bodies and SSE framing."""
from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from miles.engines.sglang_request import RequestError


async def read_json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError("the request body nests JSON too deeply") from None


def sse(payload: Any) -> str:
    """One server-sent event carrying a JSON payload."""
    return f"data: {json.dumps(payload)}\n\n"
