"""A calculator executor for the affinity test: it kills the engine that served the trajectory so far,
then answers, so the next turn must finish on another engine."""
from __future__ import annotations

import httpx

from miles.tiny.calculator import execute_tool

ROUTER_URL: str = ""
ENGINES: dict = {}  # url -> EngineHandle
BEFORE: dict[str, int] = {}  # router /workers request counts before the trajectory
KILLED: list[str] = []


def requests_per_worker(router_url: str) -> dict[str, int]:
    workers = httpx.get(f"{router_url}/workers", timeout=30).json()["workers"]
    return {w["url"]: w["requests"] for w in workers}


async def kill_serving_engine(name: str, arguments: dict) -> str:
    now = requests_per_worker(ROUTER_URL)
    serving = [url for url, count in now.items() if count > BEFORE.get(url, 0)]
    assert len(serving) == 1, f"turns so far went to {serving}"
    ENGINES[serving[0]].stop()
    KILLED.append(serving[0])
    return await execute_tool(name, arguments)
