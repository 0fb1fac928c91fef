"""Tracking overhead: a training-like loop (fixed torch compute per iteration, 200 metrics
recorded and committed each iteration) with wandb + MLflow + TensorBoard on vs all off.

Phases alternate (off, on, off, on, ...) so machine noise hits both alike; tracker start-up
(wandb init, MLflow import) happens before a phase's clock starts, and the final flush after
it stops. Prints a table, then the figures as one JSON line.

    .venv/bin/python benchmarks/tracking.py [--iterations 15] [--rounds 2] [--compute-s 0.3]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles.config import parse_config  # noqa: E402
from miles.tracking import open_tracking  # noqa: E402

NUM_METRICS = 200


def calibrate(target_s: float, size: int = 384) -> tuple[int, torch.Tensor]:
    """Matmuls per iteration that take about `target_s` here."""
    a = torch.randn(size, size)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < 0.5:
        a = torch.tanh(a @ a)
        n += 1
    per = (time.perf_counter() - start) / n
    return max(1, round(target_s / per)), a


def compute(n: int, a: torch.Tensor) -> float:
    for _ in range(n):
        a = torch.tanh(a @ a)
    return float(a[0, 0])


def metrics_for(rollout_id: int, x: float) -> dict[str, float]:
    m = {f"train/metric_{i:03d}": x + i for i in range(NUM_METRICS // 2 - 3)}
    m.update({f"rollout/metric_{i:03d}": x - i for i in range(NUM_METRICS // 2 - 3)})
    m.update({"train/loss": x, "rollout/raw_reward": 0.5, "perf/step_time": 0.3, "passrate/pass@4": 0.5,
              "train/step": float(rollout_id), "rollout/step": float(rollout_id)})
    return m


def phase(trackers_on: bool, run_dir: Path, iterations: int, n_matmul: int, a: torch.Tensor) -> list[float]:
    flags = ["--num-rollout", str(iterations)]
    if trackers_on:
        flags += ["--use-wandb", "--wandb-mode", "offline", "--use-mlflow", "--use-tensorboard"]
    config = parse_config(flags)
    tracker = open_tracking(config, run_dir)
    tracker.wait_open(300.0)
    times = []
    with contextlib.redirect_stdout(io.StringIO()):  # the rows, in both modes; kept off the table
        for rollout_id in range(iterations):
            start = time.perf_counter()
            x = compute(n_matmul, a)
            tracker.record(rollout_id, metrics_for(rollout_id, x))
            tracker.commit(rollout_id)  # every iteration: the most delivery work per second
            times.append(time.perf_counter() - start)
        report = tracker.close()
    assert not report.undelivered, report
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--compute-s", type=float, default=0.3)
    args = parser.parse_args(argv)
    n_matmul, a = calibrate(args.compute_s)
    results: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="miles-bench-tracking-") as tmp:
        for r in range(args.rounds):
            for mode in ("off", "on"):
                results[mode] += phase(mode == "on", Path(tmp) / f"{mode}-{r}", args.iterations, n_matmul, a)
    off_mean, on_mean = statistics.mean(results["off"]), statistics.mean(results["on"])
    off_med, on_med = statistics.median(results["off"]), statistics.median(results["on"])
    print(f"tracking overhead: {NUM_METRICS} metrics/iteration, committed every iteration, "
          f"{n_matmul} matmuls/iteration, {args.rounds} alternating rounds x {args.iterations} iterations")
    print(f"{'trackers':<28}{'mean s/iter':>12}{'median s/iter':>15}{'p90 s/iter':>12}")
    for mode, label in (("off", "off (journal + row only)"), ("on", "on (wandb+MLflow+TB)")):
        t = sorted(results[mode])
        print(f"{label:<28}{statistics.mean(t):>12.4f}{statistics.median(t):>15.4f}{t[int(0.9 * (len(t) - 1))]:>12.4f}")
    ratio_mean, ratio_median = on_mean / off_mean, on_med / off_med
    print(f"on/off: mean {ratio_mean:.4f} ({100 * (ratio_mean - 1):+.2f}%), "
          f"median {ratio_median:.4f} ({100 * (ratio_median - 1):+.2f}%); target within 1%")
    print(json.dumps({"metrics_per_iteration": NUM_METRICS, "iterations_per_mode": len(results["on"]),
                      "off_mean_s": round(off_mean, 5), "on_mean_s": round(on_mean, 5),
                      "off_median_s": round(off_med, 5), "on_median_s": round(on_med, 5),
                      "ratio_mean": round(ratio_mean, 4), "ratio_median": round(ratio_median, 4),
                      "within_1pct_median": abs(ratio_median - 1) <= 0.01}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
