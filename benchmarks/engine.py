"""Embedded engine throughput: 32 concurrent /generate requests vs the same 32 served one at a time.

    .venv/bin/python benchmarks/engine.py [--requests 32] [--max-new-tokens 64]

Both modes run against one engine in one run; every request decodes exactly
--max-new-tokens tokens (ignore_eos), so tokens/s compare like for like. Prints a table,
then one JSON line with the figures and the ratio.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles.config import EngineConfig  # noqa: E402
from miles.engines.launch import launch_engine  # noqa: E402
from miles.tiny.warmstart import ensure_base_model  # noqa: E402


@dataclass(frozen=True)
class ModeResult:
    mode: str
    requests: int
    tokens: int
    seconds: float
    tokens_per_s: float
    mean_latency_s: float


def body(i: int, max_new_tokens: int) -> dict:
    return {"text": f"{i % 100}+{(7 * i) % 100}=",
            "sampling_params": {"temperature": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}


def one(client: httpx.Client, payload: dict) -> tuple[int, float]:
    start = time.perf_counter()
    out = client.post("/generate", json=payload)
    out.raise_for_status()
    return out.json()["meta_info"]["completion_tokens"], time.perf_counter() - start


def run_mode(url: str, mode: str, n: int, max_new_tokens: int) -> ModeResult:
    payloads = [body(i, max_new_tokens) for i in range(n)]
    with httpx.Client(base_url=url, timeout=600, limits=httpx.Limits(max_connections=n)) as client:
        start = time.perf_counter()
        if mode == "sequential":
            results = [one(client, p) for p in payloads]
        else:
            with ThreadPoolExecutor(n) as pool:
                results = list(pool.map(lambda p: one(client, p), payloads))
        seconds = time.perf_counter() - start
    tokens = sum(t for t, _ in results)
    return ModeResult(mode, n, tokens, round(seconds, 3), round(tokens / seconds, 1),
                      round(sum(lat for _, lat in results) / n, 4))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    args = parser.parse_args(argv)
    model = ensure_base_model(progress=False)
    with launch_engine(model, EngineConfig(engine_device=args.device, engine_max_batch_size=args.requests)) as engine:
        run_mode(engine.url, "concurrent", 4, 4)  # warm-up: first-call allocations out of the timings
        sequential = run_mode(engine.url, "sequential", args.requests, args.max_new_tokens)
        concurrent = run_mode(engine.url, "concurrent", args.requests, args.max_new_tokens)
        info = httpx.get(engine.url + "/get_server_info").json()
    ratio = round(concurrent.tokens_per_s / sequential.tokens_per_s, 2)
    print(f"{'mode':<12}{'requests':>9}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}{'mean latency s':>16}")
    for r in (sequential, concurrent):
        print(f"{r.mode:<12}{r.requests:>9}{r.tokens:>8}{r.seconds:>9.2f}{r.tokens_per_s:>10.1f}"
              f"{r.mean_latency_s:>16.3f}")
    print(f"concurrent / sequential tokens/s: {ratio}x (largest batch decoded: {info['max_batch_size_seen']})")
    print(json.dumps({"sequential": asdict(sequential), "concurrent": asdict(concurrent),
                      "throughput_ratio": ratio, "max_batch_size_seen": info["max_batch_size_seen"],
                      "device": info["device"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
