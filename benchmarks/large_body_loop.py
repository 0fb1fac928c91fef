"""How long the event loop stalls while large /generate bodies are decoded and checked: on the loop
(as before probe E8's fix) versus `miles.engines.http.read_json` (a thread of its own, GIL shared).

Side by side in one run: N bodies of 5M input ids (15 MB, under the 16 MiB limit) are handled
concurrently while a ticker on the same loop records the longest gap between its turns, the time a
/health request would wait. Prints a table, then one JSON line.

    .venv/bin/python benchmarks/large_body_loop.py [--bodies 4]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from miles.engines.http import read_json
from miles.engines.sglang_request import parse_generate

BODY = json.dumps({"input_ids": [5] * 5_000_000, "sampling_params": {"max_new_tokens": 4}}).encode()
CONTEXT = 256  # the tiny model's context length: the engine's early bound


class _Body:
    async def body(self) -> bytes:
        return BODY


async def on_loop() -> None:
    await asyncio.sleep(0)
    parse_generate(json.loads(BODY))  # the old path: decode and check every id on the loop


async def off_loop() -> None:
    try:
        await read_json(_Body(), lambda body: parse_generate(body, CONTEXT))
    except Exception:  # the 400 for a prompt longer than the context
        pass


async def measure(handler, bodies: int) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    gaps, last, done = [0.0], loop.time(), False

    async def ticker():
        nonlocal last
        while not done:
            await asyncio.sleep(0.001)
            now = loop.time()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    await asyncio.gather(*(handler() for _ in range(bodies)))
    total = time.perf_counter() - start
    done = True
    await tick
    return max(gaps), total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bodies", type=int, default=4)
    args = parser.parse_args()
    old_gap, old_total = asyncio.run(measure(on_loop, args.bodies))
    new_gap, new_total = asyncio.run(measure(off_loop, args.bodies))
    print(f"{args.bodies} bodies of {len(BODY) / 2**20:.1f} MiB")
    print(f"{'path':<28} {'longest loop stall (s)':>24} {'all handled (s)':>16}")
    print(f"{'on the loop (before)':<28} {old_gap:>24.3f} {old_total:>16.2f}")
    print(f"{'read_json, own thread':<28} {new_gap:>24.3f} {new_total:>16.2f}")
    print(json.dumps({"bodies": args.bodies, "on_loop_max_stall_s": round(old_gap, 4),
                      "off_loop_max_stall_s": round(new_gap, 4), "on_loop_total_s": round(old_total, 3),
                      "off_loop_total_s": round(new_total, 3), "stall_ratio": round(old_gap / max(new_gap, 1e-6), 1)}))


if __name__ == "__main__":
    main()
