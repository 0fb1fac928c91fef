"""Orchestration overhead: the same GRPO iterations as the plain library loop and as the Prefect
flow on Ray (default chunk size), side by side; Ray and Prefect start-up measured apart.

    .venv/bin/python benchmarks/orchestration.py [--num-rollout 20] [flags for both runs...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BASE = ["--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--eval-interval", "none"]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def ray_start_seconds(num_cpus: int) -> float:
    import ray

    _, seconds = timed(lambda: ray.init(num_cpus=num_cpus, object_store_memory=256 * 2**20, include_dashboard=False,
                                        namespace="miles-bench"))
    ray.shutdown()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-rollout", type=int, default=20)
    args, extra = parser.parse_known_args(argv)
    flags = [*BASE, "--num-rollout", str(args.num_rollout), *extra]

    from flows.prefect_server import start_server
    from miles.config import parse_config
    from miles.tiny.warmstart import ensure_base_model

    ensure_base_model(progress=False)
    work = Path(tempfile.mkdtemp(prefix="miles-bench-orch-"))
    ray_s = ray_start_seconds(os.cpu_count() or 1)
    server, prefect_s = timed(lambda: start_server(work / "prefect", port=None, ui=False))
    try:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.grpo import grpo
        from miles.train import train

        _, plain_s = timed(lambda: train(parse_config([*flags, "--run-dir", str(work / "plain")])))
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            _, flow_s = timed(lambda: grpo(flags=[*flags, "--run-dir", str(work / "flow")]))
    finally:
        server.stop()
    chunk_size = parse_config(flags).orchestration.chunk_size
    overhead = (flow_s - plain_s) / flow_s
    rows = [("plain loop (miles.train.train)", plain_s), (f"Prefect flow on Ray (chunk size {chunk_size})", flow_s),
            ("Ray start-up (apart)", ray_s), ("Prefect server start-up (apart)", prefect_s)]
    print(f"\n{args.num_rollout} rollouts, flags: {' '.join(flags)}")
    print(f"{'what':<44} {'seconds':>9}")
    for name, seconds in rows:
        print(f"{name:<44} {seconds:>9.1f}")
    print(f"{'orchestration overhead (flow - plain) / flow':<44} {100 * overhead:>8.1f}%  (bar: <= 5%)")
    print(json.dumps({"num_rollout": args.num_rollout, "chunk_size": chunk_size, "plain_s": round(plain_s, 2),
                      "flow_s": round(flow_s, 2), "ray_start_s": round(ray_s, 2),
                      "prefect_server_start_s": round(prefect_s, 2), "overhead_ratio": round(overhead, 4),
                      "flow_over_plain": round(flow_s / plain_s, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
