"""Profiler cost: the training ranks' iteration (log-probs + optimizer steps on a real rank, the trainer's
phase calls around it) with profiling off, with the flags set but outside the window, and inside it.

One FSDP rank (a Ray actor) trains a fixed made-up rollout every iteration, driven through the
trainer's `RunProfiler` exactly as `RLTrainer.run_iteration` drives it (begin_iteration, the
rollout / update_weights / checkpoint phases, the ranks' sections). Rounds run the three modes in an
order that rotates each round, so drift on a busy machine hits every mode alike. Outside the window
the profiler must cost nothing: the headline is the median over rounds of outside/off, beside
inside/off (what a window costs while it runs, trace writing excluded: it happens at the window's
end, shown apart). Because round-to-round noise on a small shared machine is far larger than the
hooks' cost, it also times the outside-window hooks themselves (trainer and rank side) per iteration,
a figure noise barely moves. Prints a table per round and pooled, then the figures as one JSON line.

    .venv/bin/python benchmarks/profiling.py [--rounds 6] [--iterations 8]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "profiling"))

import ray  # noqa: E402

from miles.backends.group import ActorGroup  # noqa: E402
from miles.backends.pack import split_for_ranks  # noqa: E402
from miles.config import parse_config  # noqa: E402
from miles.profiling.driver import RunProfiler  # noqa: E402
from miles.profiling.rank import RankProfiler  # noqa: E402
from miles.tiny.warmstart import ensure_base_model  # noqa: E402

MODES = ("off", "outside", "inside")
BIG = 1_000_000  # rollout ids per mode block, so every phase's ids are fresh and absolute


def config_for(mode: str, run_dir: Path, first: int, iterations: int):
    argv = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--micro-batch-size", "8",
            "--num-steps-per-rollout", "2", "--num-rollout", str(100 * BIG), "--run-dir", str(run_dir)]
    if mode != "off":
        # outside: a window that lies after this phase's rollouts; inside: exactly this phase's rollouts
        start = first + iterations + BIG // 2 if mode == "outside" else first
        argv += ["--use-pytorch-profiler", "--profile-step-start", str(start),
                 "--profile-step-end", str(start + iterations),
                 "--profile-target", "train_overall", "train_actor", "train_log_probs"]
    return parse_config(argv)


def rollout(n: int):
    from profiling_helpers import made_up_rollout  # the profiling tests' made-up arithmetic rollout

    return made_up_rollout(n)


def phase(mode: str, group, run_dir: Path, first: int, iterations: int, samples, advantages) -> tuple[list[float], float]:
    """Iteration times of one phase, and the time its window took to close (inside only)."""
    config = config_for(mode, run_dir, first, iterations)
    with contextlib.redirect_stdout(io.StringIO()):  # the window's printed lines stay out of the table
        profiler = RunProfiler(config, run_dir, group.actors, engine_urls=[])
        times = []
        for rollout_id in range(first, first + iterations):
            start = time.perf_counter()
            profiler.begin_iteration(rollout_id)
            with profiler.phase("rollout"):
                batches = split_for_ranks(samples, advantages, config.global_batch_size, 1, rollout_id)
            group.train(batches)
            with profiler.phase("update_weights"):
                group.call("set_weight_version", rollout_id)
            with profiler.phase("checkpoint"):
                group.call("info")
            times.append(time.perf_counter() - start)
        closing = time.perf_counter()
        profiler.close()
        return times, time.perf_counter() - closing


def hook_cost_us(run_dir: Path, calls: int = 20000) -> float:
    """Microseconds per iteration that the profiling hooks cost outside a window, timed in this process:
    the trainer's begin_iteration and four phases, the rank's two sections and two spans (the same code
    the ranks run; the ranks are not called at all outside a window). Noise barely moves this figure."""
    config = config_for("outside", run_dir, 0, 2)
    with contextlib.redirect_stdout(io.StringIO()):
        profiler = RunProfiler(config, run_dir, [], engine_urls=[])
    rank = RankProfiler(0)
    start = time.perf_counter()
    for rollout_id in range(calls):
        profiler.begin_iteration(rollout_id)
        for name in ("rollout", "update_weights", "checkpoint", "eval"):
            with profiler.phase(name):
                pass
        with rank.section("train_log_probs", rollout_id), rank.span("log_probs"):
            pass
        with rank.section("train_actor", rollout_id), rank.span("actor_train"):
            pass
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the three modes, order rotating")
    parser.add_argument("--iterations", type=int, default=8, help="timed iterations per phase")
    args = parser.parse_args(argv)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    work = Path(tempfile.mkdtemp(prefix="miles-profiling-bench-"))
    config = config_for("off", work / "run", 0, 1)
    group = ActorGroup(config, str(ensure_base_model(progress=False)))
    samples, advantages = rollout(16)
    try:
        phase("off", group, work / "warmup", 0, 2, samples, advantages)  # first-call costs out of the clock
        results = {mode: [] for mode in MODES}
        closes = []
        ratios = {"outside": [], "inside": []}
        print(f"{'round':>5} {'order':<22} {'off s':>8} {'outside s':>10} {'inside s':>9} "
              f"{'out/off':>8} {'in/off':>7}")
        for r in range(args.rounds):
            order = MODES[r % 3:] + MODES[:r % 3]
            means = {}
            for i, mode in enumerate(order):
                first = (r * 3 + i + 1) * BIG
                times, close_s = phase(mode, group, work / f"run-{r}-{mode}", first, args.iterations,
                                       samples, advantages)
                results[mode] += times
                means[mode] = statistics.mean(times)
                if mode == "inside":
                    closes.append(close_s)
            for mode in ratios:
                ratios[mode].append(means[mode] / means["off"])
            print(f"{r:>5} {'/'.join(order):<22} {means['off']:>8.3f} {means['outside']:>10.3f} "
                  f"{means['inside']:>9.3f} {ratios['outside'][-1]:>8.3f} {ratios['inside'][-1]:>7.3f}")
        pooled = {mode: statistics.mean(times) for mode, times in results.items()}
        print(f"{'all':>5} {'pooled means':<22} {pooled['off']:>8.3f} {pooled['outside']:>10.3f} "
              f"{pooled['inside']:>9.3f} {pooled['outside'] / pooled['off']:>8.3f} "
              f"{pooled['inside'] / pooled['off']:>7.3f}")
        print(f"window close (trace export, slicing, summaries): median {statistics.median(closes):.2f} s")
        hooks = hook_cost_us(work / "hooks")
        print(f"hooks outside a window: {hooks:.2f} us per iteration = "
              f"{hooks / 1e6 / pooled['off'] * 100:.5f}% of the off iteration")
        print(json.dumps({
            "rounds": args.rounds, "iterations_per_phase": args.iterations,
            "iteration_s": {mode: round(pooled[mode], 4) for mode in MODES},
            "median_round_ratio_outside_over_off": round(statistics.median(ratios["outside"]), 4),
            "median_round_ratio_inside_over_off": round(statistics.median(ratios["inside"]), 4),
            "pooled_ratio_outside_over_off": round(pooled["outside"] / pooled["off"], 4),
            "pooled_ratio_inside_over_off": round(pooled["inside"] / pooled["off"], 4),
            "window_close_s_median": round(statistics.median(closes), 3),
            "hooks_outside_us_per_iteration": round(hooks, 3),
            "hooks_outside_share_of_iteration": round(hooks / 1e6 / pooled["off"], 8),
        }))
    finally:
        group.stop()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
