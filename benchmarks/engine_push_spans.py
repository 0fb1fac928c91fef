"""What an engine's push spans cost a weight push: one embedded engine (in this process, behind
Starlette's test client) loads the tiny model's checkpoint from disk, paused in_place and continued
around it as in async training, with its push spans written to a timeline file (on) or not (off),
side by side.

    .venv/bin/python benchmarks/engine_push_spans.py [--rounds 20]

Each round pushes twice, once on and once off (the order alternates, so a noisy neighbour hits
both alike; round 0 warms up and is not counted). A push is the wall time of pause + disk load +
continue as the client sees it. Also printed: the writer's own seconds per span (what each span
costs the engine: one `os.write` of one line; `miles.record.timeline.TimelineWriter.seconds`),
from which a broadcast push's cost follows (two spans per bucket: its receive and the wait before
it). One JSON line: medians on/off, the overhead ratio of the medians (goal: within noise), the
median of each round's own on/off ratio, and microseconds per span.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one_push(client, model_dir: str, version: int) -> float:
    start = time.perf_counter()
    for path, body in (("/pause_generation", {"mode": "in_place"}),
                       ("/update_weights_from_disk", {"model_path": model_dir,
                                                      "weight_version": str(version)}),
                       ("/continue_generation", {})):
        response = client.post(path, json=body)
        if response.status_code != 200:
            raise SystemExit(f"{path}: {response.status_code} {response.text[:200]}")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    from starlette.testclient import TestClient

    from miles.config import EngineConfig
    from miles.engines.model_runner import ModelRunner
    from miles.engines.push_spans import EngineCoords
    from miles.engines.server import EngineServer
    from miles.record.timeline import TimelineWriter, read_spans
    from miles.tiny.warmstart import ensure_base_model

    model_dir = str(ensure_base_model(progress=False))
    path = Path(tempfile.mkdtemp(prefix="engine-push-spans-")) / "timeline.jsonl"
    writer, silent = TimelineWriter(path, lane="engine bench"), TimelineWriter(None)
    server = EngineServer(ModelRunner(model_dir, device="cpu", cpu_threads=1), EngineConfig(),
                          coords=EngineCoords(0, "http://bench"))
    on, off, ratios = [], [], []
    with TestClient(server.app) as client:
        for r in range(args.rounds + 1):
            pair = {}
            for enabled in ((True, False) if r % 2 == 0 else (False, True)):
                server.push_spans.timeline = writer if enabled else silent
                pair[enabled] = one_push(client, model_dir, 2 * r + int(enabled))
            if r == 0:
                continue  # warm-up
            on.append(pair[True])
            off.append(pair[False])
            ratios.append(pair[True] / pair[False])
            print(f"round {r:2d}: on {pair[True] * 1e3:8.2f} ms  off {pair[False] * 1e3:8.2f} ms")
    spans = [s for s in read_spans(path) if "kind" in s.args]
    per_span_us = writer.seconds / len(spans) * 1e6
    result = {"rounds": args.rounds, "push_on_ms": statistics.median(on) * 1e3,
              "push_off_ms": statistics.median(off) * 1e3,
              "overhead_of_medians": statistics.median(on) / statistics.median(off) - 1,
              "median_round_ratio": statistics.median(ratios) - 1,
              "spans_per_push": len(spans) / (args.rounds + 1),  # round 0 wrote too
              "write_us_per_span": per_span_us}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
