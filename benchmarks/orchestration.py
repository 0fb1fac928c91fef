"""Orchestration overhead: the same GRPO iterations as the plain library loop and as the Prefect
flow on Ray (default chunk size), side by side; Ray and Prefect start-up measured apart.

Runs alternate over rounds (plain then flow, then flow then plain, ...) so drift on a small
machine hits both alike. Each run's wall time is split, from its journal's timestamps, into
start-up (call to the first iteration), iterations, the time between iterations (chunk
boundaries: checkpoint, tracker close, next task, resume) and teardown. Prints a table, then
one JSON line with the figures and ratios.

    .venv/bin/python benchmarks/orchestration.py [--rounds 2] [--num-rollout N] [flags for both runs...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclass
class Run:
    mode: str  # "plain" | "flow"
    wall_s: float
    startup_s: float  # call to the start of the first iteration
    iterations_s: float  # sum of the iterations' step (and eval) times
    between_s: float  # gaps between iterations beyond their own time
    teardown_s: float  # end of the last iteration to return


def split_wall(mode: str, run_dir: Path, started: float, ended: float) -> Run:
    """Where a run's wall time went, from the journal (one line per iteration, stamped at its end)."""
    from miles.record.journal import read_journal

    lines = [ln for ln in read_journal(run_dir / "metrics.jsonl") if ln.rollout_id >= 0]  # not the base eval
    own = [line.metrics.get("perf/step_time", 0.0) + line.metrics.get("perf/eval_time", 0.0) for line in lines]
    first_start = lines[0].time - own[0]
    between = sum(max(0.0, (b.time - a.time) - t) for a, b, t in zip(lines, lines[1:], own[1:]))
    return Run(mode, ended - started, first_start - started, sum(own), between, ended - lines[-1].time)


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


def run_once(mode: str, flags: list[str], run_dir: Path, api_url: str) -> Run:
    from miles.config import parse_config

    started_wall, started = time.time(), time.perf_counter()
    if mode == "plain":
        from miles.prepare import prepare_config
        from miles.train import train

        train(prepare_config(parse_config([*flags, "--run-dir", str(run_dir)])))
    else:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.grpo import grpo

        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            grpo(flags=[*flags, "--run-dir", str(run_dir)])
    wall = time.perf_counter() - started
    return split_wall(mode, run_dir, started_wall, started_wall + wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating plain/flow pairs (default 2)")
    args, flags = parser.parse_known_args(argv)

    from flows.prefect_server import start_server
    from miles.config import parse_config
    from miles.tiny.warmstart import ensure_base_model

    config = parse_config(flags)  # a bad flag fails here, before anything starts
    ensure_base_model(progress=False)
    work = Path(tempfile.mkdtemp(prefix="miles-bench-orch-"))
    ray_s = ray_start_seconds(os.cpu_count() or 1)
    server, prefect_s = timed(lambda: start_server(work / "prefect", port=None, ui=False))
    runs: list[Run] = []
    try:
        for r in range(args.rounds):
            order = ("plain", "flow") if r % 2 == 0 else ("flow", "plain")
            for mode in order:
                runs.append(run_once(mode, flags, work / f"{mode}-{r}", server.api_url))
                print(f"[bench] round {r} {mode}: {runs[-1].wall_s:.1f}s", flush=True)
    finally:
        server.stop()

    by_mode = {m: [run for run in runs if run.mode == m] for m in ("plain", "flow")}
    mean = {m: {f: statistics.mean(getattr(run, f) for run in rs) for f in
                ("wall_s", "startup_s", "iterations_s", "between_s", "teardown_s")} for m, rs in by_mode.items()}
    per_round = [(f.wall_s - p.wall_s) / f.wall_s for p, f in zip(by_mode["plain"], by_mode["flow"])]
    overhead = (mean["flow"]["wall_s"] - mean["plain"]["wall_s"]) / mean["flow"]["wall_s"]
    chunk = config.orchestration.chunk_size
    print(f"\n{config.rollout.num_rollout} rollouts, chunk size {chunk}, {args.rounds} alternating rounds, "
          f"flags: {' '.join(flags) or '(defaults)'}")
    print(f"{'mean seconds':<26}{'wall':>8}{'start-up':>10}{'iterations':>12}{'between':>9}{'teardown':>10}")
    for m, label in (("plain", "plain loop"), ("flow", "Prefect flow on Ray")):
        row = mean[m]
        print(f"{label:<26}{row['wall_s']:>8.1f}{row['startup_s']:>10.1f}{row['iterations_s']:>12.1f}"
              f"{row['between_s']:>9.1f}{row['teardown_s']:>10.1f}")
    print(f"{'Ray start-up (apart)':<26}{ray_s:>8.1f}")
    print(f"{'Prefect server (apart)':<26}{prefect_s:>8.1f}")
    print(f"orchestration overhead (flow - plain) / flow: {100 * overhead:.1f}% of mean wall "
          f"(per round: {', '.join(f'{100 * o:.1f}%' for o in per_round)}); bar: <= 5%")
    print(json.dumps({"num_rollout": config.rollout.num_rollout, "chunk_size": chunk, "rounds": args.rounds,
                      "plain_s": [round(r.wall_s, 2) for r in by_mode["plain"]],
                      "flow_s": [round(r.wall_s, 2) for r in by_mode["flow"]],
                      "mean": {m: {k: round(v, 2) for k, v in row.items()} for m, row in mean.items()},
                      "ray_start_s": round(ray_s, 2), "prefect_server_start_s": round(prefect_s, 2),
                      "overhead_per_round": [round(o, 4) for o in per_round], "overhead_ratio": round(overhead, 4),
                      "flow_over_plain": round(mean["flow"]["wall_s"] / mean["plain"]["wall_s"], 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
