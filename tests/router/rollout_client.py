"""One request sent the way a rollout sends it (GenerateState over the rollout's HTTP client), with
its re-send rules taken from `args` (use_fault_tolerance, engine_wait_timeout)."""
from __future__ import annotations

import asyncio

from miles.rollout.generate import GenerateState
from miles.rollout.http_client import json_poster


def post_once(url: str, args) -> dict:
    async def run():
        client = json_poster(url, 30.0, 4)
        try:
            state = GenerateState(url, None, args, client, asyncio.Semaphore(4))
            return await state.generate({"input_ids": [1]})
        finally:
            await client.aclose()
    return asyncio.run(run())
