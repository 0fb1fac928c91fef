"""Tracking overhead and live lag: a training-like loop (fixed torch compute per iteration,
metrics recorded each iteration) with wandb + MLflow + TensorBoard on vs all off. The defaults
are the default run's shape: 45 metrics per 2.3 s iteration; `--metrics 200 --compute-s 0.3` is a stress case.

Many short phases, in rounds that alternate their order (off then on, then on then off, ...)
so drift and noise on a busy machine hit both modes alike. Each round's ratio is its on phase's
mean iteration time over its adjacent off phase's; the headline is the median of those ratios,
beside the pooled mean and median over every iteration. Tracker start-up (the delivery process,
wandb init, MLflow import) happens before a phase's clock starts, and the final flush after it
stops (its time, what delivery left for the end, is shown apart), as does the share of the
phase's lines the trackers already held when its clock stopped ("live").

Live lag: in one more on phase (`--lag-iterations`, outside the ratios, since the watching is
the user's CPU) an observer process (the user watching, at normal priority)
polls every tracker's own store every 0.25 s (MLflow's SQLite tables, the TensorBoard event
files, the wandb offline file) and notes when each recorded iteration's `rollout/step` point
first appears there; the lag is that moment minus the record, p50 and max per tracker.
Because phase-to-phase noise on a small shared machine is larger than 1%, it also prints an
accounted upper bound that noise barely moves: the training thread's extra time in record,
plus all CPU time of the delivery process tree while the clock ran, per iteration.
Prints a table per round and pooled, then the figures as one JSON line; the ratios are what
was measured, nothing is clamped.

    .venv/bin/python benchmarks/tracking.py [--rounds 4] [--iterations 10] [--lag-iterations 20] [--compute-s 2.3] [--metrics 45]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles.config import parse_config  # noqa: E402
from miles.tracking import open_tracking  # noqa: E402
from miles.tracking.state import DeliveryState  # noqa: E402

TARGET = 0.01  # the issue's bar: on within 1% of off
CLK_TCK = os.sysconf("SC_CLK_TCK")
TRACKERS = ("wandb", "mlflow", "tensorboard")
OBSERVE_S = 0.25  # the observer's poll interval: lags are measured to within it


@dataclass
class Phase:
    round: int
    mode: str  # "off" | "on"
    times: list[float]
    delivery_cpu_s: float | None = None  # the delivery process's CPU time while the clock ran (on only)
    close_s: float = 0.0  # close() after the clock stopped: what delivery left for the end (not in the ratios)
    live: float | None = None  # share of the phase's lines every tracker held when the clock stopped (on only)
    calls_s: float = 0.0  # time the training thread spent in record, per iteration
    lags: dict[str, list[float]] | None = None  # per tracker, seconds from each record to its point in the store

    @property
    def mean(self) -> float:
        return statistics.mean(self.times)


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


def metrics_for(rollout_id: int, x: float, count: int) -> dict[str, float]:
    m = {f"train/metric_{i:03d}": x + i for i in range(count // 2 - 3)}
    m.update({f"rollout/metric_{i:03d}": x - i for i in range(count - count // 2 - 3)})
    m.update({"train/loss": x, "rollout/raw_reward": 0.5, "perf/step_time": 0.3, "passrate/pass@4": 0.5,
              "train/step": float(rollout_id), "rollout/step": float(rollout_id)})
    return m


def descendants(pid: int) -> list[int]:
    """The process and its live descendants (the delivery process starts wandb-core, for one)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo += [int(c) for c in children.read_text().split()]
            except OSError:
                pass
    return found


def cpu_seconds(pid: int | None) -> float | None:
    """utime + stime of a process and its descendants, from /proc (None where unreadable)."""
    if pid is None:
        return None
    total = 0.0
    try:
        for member in descendants(pid):
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)
    except OSError:
        return None
    return total


def phase(r: int, mode: str, run_dir: Path, iterations: int, n_matmul: int, a: torch.Tensor,
          n_metrics: int, watch: bool = False) -> Phase:
    flags = ["--num-rollout", str(iterations)]
    if mode == "on":
        flags += ["--use-wandb", "--wandb-mode", "offline", "--use-mlflow", "--use-tensorboard"]
    config = parse_config(flags)
    tracker = open_tracking(config, run_dir)
    tracker.open({})
    tracker.wait_open(300.0)
    pid = tracker.delivery.pid if tracker.delivery is not None else None
    observer = start_observer(run_dir) if watch else None
    times, calls, recorded_at = [], [], []
    with contextlib.redirect_stdout(io.StringIO()):  # the rows, in both modes; kept off the table
        cpu_start = cpu_seconds(pid)
        for rollout_id in range(iterations):
            start = time.perf_counter()
            x = compute(n_matmul, a)
            called = time.perf_counter()
            tracker.record(rollout_id, metrics_for(rollout_id, x, n_metrics))
            recorded_at.append(time.time())
            times.append(time.perf_counter() - start)
            calls.append(time.perf_counter() - called)
        cpu_end = cpu_seconds(pid)
        live = live_share(run_dir, iterations) if mode == "on" else None
        closing = time.perf_counter()
        report = tracker.close()
        close_s = time.perf_counter() - closing
    assert not report, report
    lags = stop_observer(observer, run_dir, recorded_at) if observer is not None else None
    cpu = cpu_end - cpu_start if cpu_start is not None and cpu_end is not None else None
    return Phase(r, mode, times, cpu, close_s, live, statistics.mean(calls), lags)


# -- the live-lag observer (a separate process: `tracking.py --observe RUN_DIR`) -----------------
def start_observer(run_dir: Path) -> subprocess.Popen:
    """The observer, once it polls (its imports done before the phase's clock starts)."""
    proc = subprocess.Popen([sys.executable, __file__, "--observe", str(run_dir)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (run_dir / "observer.ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the observer did not start"
        time.sleep(0.1)  # poll interval of the readiness check
    return proc


def stop_observer(proc: subprocess.Popen, run_dir: Path, recorded_at: list[float]) -> dict[str, list[float]]:
    """Stop the observer (after one last poll) and turn its first sightings into lags per tracker."""
    (run_dir / "observer.stop").touch()
    proc.wait(timeout=120)
    seen = json.loads((run_dir / "observer.json").read_text())
    lags = {}
    for name, steps in seen.items():
        missing = [i for i in range(len(recorded_at)) if str(i) not in steps]
        assert not missing, f"{name}: steps {missing} never seen in the store"
        lags[name] = [steps[str(i)] - recorded_at[i] for i in range(len(recorded_at))]
    return lags


def observe(run_dir: Path) -> None:
    """Poll each tracker's store until told to stop; write when each rollout/step first appeared."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from miles.tracking.wandb_files import read_records

    sinks = {}
    while len(sinks) < len(TRACKERS):  # the trackers are open before the phase starts
        sinks = {n: s.spec.options for n, s in DeliveryState.load(run_dir).sinks.items()}
        time.sleep(OBSERVE_S)
    seen: dict[str, dict[int, float]] = {name: {} for name in TRACKERS}
    db = sqlite3.connect(sinks["mlflow"]["tracking_uri"].removeprefix("sqlite:///"))
    loaders: dict[Path, EventFileLoader] = {}
    sizes: dict[Path, int] = {}
    while True:
        stopping = (run_dir / "observer.stop").exists()
        now = time.time()
        for (step,) in db.execute("SELECT step FROM metrics WHERE run_uuid = ? AND key = 'rollout/step'",
                                  (sinks["mlflow"]["run_id"],)):
            seen["mlflow"].setdefault(step, now)
        for path in Path(sinks["tensorboard"]["log_dir"]).glob("events.out.tfevents.*"):
            for event in loaders.setdefault(path, EventFileLoader(str(path))).Load():
                if any(v.tag == "rollout/step" for v in event.summary.value):
                    seen["tensorboard"].setdefault(event.step, now)
        for path in Path(sinks["wandb"]["directory"]).glob(f"wandb/offline-run-*-{sinks['wandb']['run_id']}/*.wandb"):
            if sizes.get(path) == (size := path.stat().st_size):
                continue  # nothing new flushed
            sizes[path] = size
            for record in read_records(path):
                for item in record.history.item:
                    if (item.key or "/".join(item.nested_key)) == "rollout/step":
                        seen["wandb"].setdefault(int(json.loads(item.value_json)), now)
        if stopping:
            break
        (run_dir / "observer.ready").touch()
        time.sleep(OBSERVE_S)
    (run_dir / "observer.json").write_text(json.dumps(seen))


def live_share(run_dir: Path, lines: int) -> float:
    """How much of the phase's lines the slowest tracker already holds (delivery keeps up
    during training, rather than leaving it all for close)."""
    sinks = DeliveryState.load(run_dir).sinks.values()
    return min((s.cursor for s in sinks), default=0) / lines


def pct(ratio: float) -> str:
    return f"{100 * (ratio - 1):+.2f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds of one off and one on phase, order alternating")
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations per phase")
    parser.add_argument("--compute-s", type=float, default=2.3, help="torch compute per iteration (seconds)")
    parser.add_argument("--metrics", type=int, default=45, help="metrics recorded per iteration (at least 8)")
    parser.add_argument("--lag-iterations", type=int, default=20, help="iterations of the watched phase (live lag)")
    parser.add_argument("--observe", type=Path, help=argparse.SUPPRESS)  # internal: the live-lag observer
    args = parser.parse_args(argv)
    if args.metrics < 8:
        parser.error(f"--metrics must be at least 8 (the step counters and the keys every run has), got {args.metrics}")
    if args.observe:
        observe(args.observe)
        return 0
    n_matmul, a = calibrate(args.compute_s)
    rounds: list[tuple[str, Phase, Phase]] = []
    with tempfile.TemporaryDirectory(prefix="miles-bench-tracking-") as tmp:
        for r in range(args.rounds):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            done = {mode: phase(r, mode, Path(tmp) / f"{mode}-{r}", args.iterations, n_matmul, a, args.metrics)
                    for mode in order}
            rounds.append(("/".join(order), done["off"], done["on"]))
        # the lag, watched by the observer in a phase of its own: its polling is the user's CPU, not
        # the trackers', so it stays out of the ratios above
        watched = phase(args.rounds, "on", Path(tmp) / "watched", args.lag_iterations, n_matmul, a, args.metrics,
                        watch=True)

    ratios = [on.mean / off.mean for _, off, on in rounds]
    pooled = {"off": [t for _, off, _ in rounds for t in off.times], "on": [t for _, _, on in rounds for t in on.times]}
    off_mean, on_mean = statistics.mean(pooled["off"]), statistics.mean(pooled["on"])
    off_med, on_med = statistics.median(pooled["off"]), statistics.median(pooled["on"])
    ratio_rounds = statistics.median(ratios)
    ratio_mean, ratio_median = on_mean / off_mean, on_med / off_med

    print(f"tracking overhead: {args.metrics} metrics/iteration, {n_matmul} matmuls "
          f"(~{args.compute_s}s)/iteration; {args.rounds} rounds x {args.iterations} iterations per phase, "
          f"order alternating off/on, on/off")
    print(f"{'round':>5}  {'order':<7}{'off mean s/iter':>16}{'on mean s/iter':>16}{'on/off':>9}{'':>9}"
          f"{'delivery CPU s':>16}{'live':>6}{'close s off/on':>16}")
    for (order, off, on), ratio in zip(rounds, ratios):
        cpu = "n/a" if on.delivery_cpu_s is None else f"{on.delivery_cpu_s:.2f}"
        live = "n/a" if on.live is None else f"{100 * on.live:.0f}%"
        print(f"{off.round:>5}  {order:<7}{off.mean:>16.4f}{on.mean:>16.4f}{ratio:>9.4f}{pct(ratio):>9}{cpu:>16}"
              f"{live:>6}{f'{off.close_s:.2f}/{on.close_s:.2f}':>16}")
    print(f"{'pooled':<29}{'mean s/iter':>12}{'median s/iter':>15}{'p90 s/iter':>12}")
    for mode, label in (("off", "off (journal + row only)"), ("on", "on (wandb+MLflow+TB, niced)")):
        t = sorted(pooled[mode])
        print(f"{label:<29}{statistics.mean(t):>12.4f}{statistics.median(t):>15.4f}"
              f"{t[int(0.9 * (len(t) - 1))]:>12.4f}")
    print(f"on/off: median of round ratios {ratio_rounds:.4f} ({pct(ratio_rounds)}); pooled mean {ratio_mean:.4f} "
          f"({pct(ratio_mean)}), pooled median {ratio_median:.4f} ({pct(ratio_median)}); target within "
          f"{100 * TARGET:g}%")
    cpus = [on.delivery_cpu_s for _, _, on in rounds if on.delivery_cpu_s is not None]
    # What the trackers can cost an iteration at most, from quantities 2-core noise barely moves: the
    # training thread's extra time in record, plus every CPU second the delivery process
    # used while the clock ran (as if each one displaced training).
    calls_off = statistics.mean(off.calls_s for _, off, _ in rounds)
    calls_on = statistics.mean(on.calls_s for _, _, on in rounds)
    delivery_per_iteration = sum(cpus) / (len(cpus) * args.iterations) if cpus else 0.0
    accounted = (calls_on - calls_off + delivery_per_iteration) / off_med
    print(f"accounted upper bound: record {1000 * calls_on:.2f} ms on vs {1000 * calls_off:.2f} ms off, "
          f"delivery CPU {1000 * delivery_per_iteration:.2f} ms per iteration -> {100 * accounted:+.2f}% "
          f"of the median off iteration")
    lags = {name: sorted(watched.lags[name]) for name in TRACKERS}
    lag_figures = {name: {"p50_s": round(statistics.median(v), 3), "max_s": round(max(v), 3), "points": len(v)}
                   for name, v in lags.items()}
    print(f"live lag, record -> point in the tracker's store (observer polls every {OBSERVE_S}s), "
          f"{sum(len(v) for v in lags.values())} points:")
    for name, fig in lag_figures.items():
        print(f"  {name:<12} p50 {fig['p50_s']:6.2f}s  max {fig['max_s']:6.2f}s  ({fig['points']} lines)")
    print(json.dumps({
        "live_lag": lag_figures, "live_lag_max_s": max(f["max_s"] for f in lag_figures.values()),
        "metrics_per_iteration": args.metrics, "rounds": args.rounds, "iterations_per_phase": args.iterations,
        "compute_s": args.compute_s, "matmuls_per_iteration": n_matmul,
        "phases": [{"round": off.round, "order": order, "off_mean_s": round(off.mean, 5),
                    "on_mean_s": round(on.mean, 5), "ratio": round(ratio, 4),
                    "delivery_cpu_s": None if on.delivery_cpu_s is None else round(on.delivery_cpu_s, 3),
                    "off_close_s": round(off.close_s, 3), "on_close_s": round(on.close_s, 3),
                    "delivered_live": None if on.live is None else round(on.live, 3)}
                   for (order, off, on), ratio in zip(rounds, ratios)],
        "off_mean_s": round(off_mean, 5), "on_mean_s": round(on_mean, 5),
        "off_median_s": round(off_med, 5), "on_median_s": round(on_med, 5),
        "ratio_median_of_rounds": round(ratio_rounds, 4), "ratio_pooled_mean": round(ratio_mean, 4),
        "ratio_pooled_median": round(ratio_median, 4),
        "delivery_cpu_s_per_on_iteration": round(sum(cpus) / (len(cpus) * args.iterations), 4) if cpus else None,
        "record_ms_off": round(1000 * calls_off, 3), "record_ms_on": round(1000 * calls_on, 3),
        "accounted_overhead": round(accounted, 4), "within_1pct_accounted": accounted <= TARGET,
        "within_1pct_median_of_rounds": abs(ratio_rounds - 1) <= TARGET,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
