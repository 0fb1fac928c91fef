"""What the dashboard's files cost the training loop: the phase timeline (every iteration) and the
per-token files (logged iterations), against the iteration time, side by side in one run.

    .venv/bin/python benchmarks/dashboard.py [--num-rollout 14] [--warmup 2] [any run flags]

One plain run (`python -m miles.train`'s loop, the default tiny config, trackers off) with
`--log-samples-interval 2`: even rollouts write the sample table and the per-token file (the
ranks also send back per-token log-probs and entropy), odd rollouts do not, so logged and
unlogged iterations alternate under the same machine noise. Reported:
- the measured cost, from the run's own timeline: the trainer's `log_tokens` span (token file)
  and each logged rank's `token_stats` span (copying the per-token values out), per logged
  iteration, and the cost of writing the timeline itself (all its spans, the engine's batches
  included, per iteration, times the time one span write takes, timed here over many writes);
- the wall-time view: mean step time of logged vs unlogged iterations (noisy: a few % between
  neighbouring iterations on a shared CPU, so the accounted share is the figure to read).
The last line is one JSON object with the figures and ratios.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def span_write_seconds(reps: int = 20000) -> float:
    """Seconds one timeline span write takes (the trainer's code path, a real file)."""
    from miles.record.timeline import TimelineWriter

    with tempfile.TemporaryDirectory() as tmp:
        writer = TimelineWriter(Path(tmp) / "timeline.jsonl")
        now = time.time()
        for i in range(reps):
            writer.add("actor_train", now, now + 0.5, i, lane="rank0")
        writer.close()
    return writer.seconds / reps


def main(argv: list[str] | None = None) -> int:
    from miles.config import parse_config
    from miles.record.journal import read_journal
    from miles.record.timeline import read_spans
    from miles.prepare import prepare_config
    from miles.train import train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-rollout", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=2, help="first iterations left out (start-up effects)")
    args, flags = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="miles-bench-dashboard-") as tmp:
        run_dir = Path(tmp) / "run"
        config = parse_config(["--num-rollout", str(args.num_rollout), "--log-samples-interval", "2",
                               "--eval-interval", "none", "--run-dir", str(run_dir), *flags])
        train(prepare_config(config))
        lines = read_journal(run_dir / "metrics.jsonl")
        spans = read_spans(run_dir / "timeline.jsonl")
        samples_per_rollout = len((run_dir / "tokens" / "rollout_000000.jsonl").read_text().splitlines())
        token_file_bytes = (run_dir / "tokens" / "rollout_000000.jsonl").stat().st_size
    per_span = span_write_seconds()

    kept = [ln for ln in lines if ln.rollout_id >= args.warmup]
    step = {ln.rollout_id: ln.metrics["perf/step_time"] for ln in kept}
    logged = [r for r in step if r % 2 == 0]
    unlogged = [r for r in step if r % 2 == 1]
    # every span of the run (engine batches and start-up included) over the iterations: an upper bound
    spans_per_iteration = len(spans) / len(lines)
    token_file, rank_stats = defaultdict(float), defaultdict(float)
    for s in spans:
        if s.name == "log_tokens":
            token_file[s.rollout_id] += s.end - s.start
        if s.name == "token_stats":  # ranks run in parallel: the slowest one delays the step
            rank_stats[s.rollout_id] = max(rank_stats[s.rollout_id], s.end - s.start)
    mean_step = statistics.mean(step.values())
    timeline_cost = spans_per_iteration * per_span
    token_cost = statistics.mean(token_file[r] + rank_stats[r] for r in logged)
    logged_share = (timeline_cost + token_cost) / statistics.mean(step[r] for r in logged)
    unlogged_share = timeline_cost / statistics.mean(step[r] for r in unlogged)
    wall_ratio = statistics.mean(step[r] for r in logged) / statistics.mean(step[r] for r in unlogged)

    rows = [("iterations (after warm-up)", f"{len(logged)} logged, {len(unlogged)} not"),
            ("samples per rollout", f"{samples_per_rollout} ({token_file_bytes / 1024:.1f} KiB token file)"),
            ("mean step time", f"{mean_step * 1e3:.1f} ms (logged {statistics.mean(step[r] for r in logged) * 1e3:.1f}, "
                               f"not {statistics.mean(step[r] for r in unlogged) * 1e3:.1f})"),
            ("timeline: spans per iteration x one write",
             f"{spans_per_iteration:.1f} x {per_span * 1e6:.1f} us = "
             f"{timeline_cost * 1e3:.3f} ms"),
            ("token file (trainer, logged iterations)", f"{statistics.mean(token_file[r] for r in logged) * 1e3:.2f} ms"),
            ("per-token stats (slowest rank, logged)", f"{statistics.mean(rank_stats[r] for r in logged) * 1e3:.2f} ms"),
            ("share of a logged iteration", f"{logged_share * 100:.3f} %"),
            ("share of an unlogged iteration", f"{unlogged_share * 100:.4f} %"),
            ("wall: logged / unlogged step time", f"{wall_ratio:.3f} (noise of neighbouring iterations)")]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(json.dumps({
        "iterations_logged": len(logged), "iterations_unlogged": len(unlogged), "samples_per_rollout": samples_per_rollout,
        "mean_step_time_s": round(mean_step, 4), "timeline_cost_s": round(timeline_cost, 7),
        "token_file_s": round(statistics.mean(token_file[r] for r in logged), 6),
        "token_stats_s": round(statistics.mean(rank_stats[r] for r in logged), 6),
        "logged_iteration_share": round(logged_share, 6), "unlogged_iteration_share": round(unlogged_share, 7),
        "wall_ratio_logged_over_unlogged": round(wall_ratio, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
