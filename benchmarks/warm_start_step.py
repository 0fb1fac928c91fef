"""The host's speed gauge the suite's times are quoted beside: one training step of the tiny warm
start (the tiny policy, a batch of 64 problems: forward, backward, AdamW) on one torch thread, as
the models the suite makes are trained, in a fresh process; the median milliseconds of `--repeats`
processes of `--steps` steps, each after an untimed first step.

    .venv/bin/python benchmarks/warm_start_step.py [--steps 100] [--repeats 3]

A suite time divided by this gauge is roughly constant across hours and hosts (about 35,000 steps),
so two suite times are compared through it. Prints one JSON line."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.omp_wait import ms_per_step  # noqa: E402 (the same step, timed the same way)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be at least 1")
    # OMP_WAIT_POLICY as runs set it: one thread has nothing to spin for, so either reads the same
    times = [ms_per_step(1, args.steps, "PASSIVE", False) for _ in range(args.repeats)]
    print(json.dumps({"ms_per_warm_start_step": round(statistics.median(times), 1),
                      "runs_ms": [round(t, 1) for t in times], "steps": args.steps, "threads": 1}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
