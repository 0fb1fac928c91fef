"""Sync vs async GRPO, side by side: wall time to a target held-out pass@1, over seeds.

    .venv/bin/python benchmarks/async.py [--seeds 3] [--target 0.9] [--k 1] [--config configs/tiny-cpu.yaml] [-- FLAGS]

For each seed it runs `python -m miles.train` twice, interleaved (sync, then async, so both see the same
machine load over time): once synchronous, once with `--fully-async --max-weight-staleness K --use-tis`.
From each run's journal: the seconds from the base eval's line (training starts) to the first eval at or
above --target (none when never reached), the final pass@1, the whole train time, the mean trainer idle
ratio and the largest staleness seen. An uncorrected async run is not run: the config refuses it, and the
refusal is reported. Prints a table, then one JSON line: per mode the medians over seeds, and the
async/sync ratio of the median times to target.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from miles.config import ConfigError, parse_config  # noqa: E402
from miles.record.journal import read_journal  # noqa: E402
from miles.record.layout import RunLayout  # noqa: E402
from miles.run.scorecard import eval_key_of  # noqa: E402


def time_to_target(run_dir: Path, target: float) -> dict:
    """What one run's journal says: seconds from the start of training (the base eval's line) to the first
    eval at or above `target`, the final eval, the train time, idle ratio and staleness."""
    journal = read_journal(RunLayout(run_dir).journal)
    if not journal:
        return {"reached_s": None, "final": None, "train_s": None, "idle_ratio": None, "max_staleness": None}
    key = eval_key_of({k for ln in journal for k in ln.metrics})
    start = journal[0].time  # the base eval's line (fresh runs), written as training starts
    trained = [ln for ln in journal if ln.rollout_id >= 0]
    evals = [ln for ln in trained if key in ln.metrics]
    reached = next((ln.time - start for ln in evals if ln.metrics[key] >= target), None)
    idle = [ln.metrics["perf/trainer_idle_ratio"] for ln in trained if "perf/trainer_idle_ratio" in ln.metrics]
    if not idle:  # sync: the trainer waits for the whole rollout
        idle = [ln.metrics["perf/wait_time_ratio"] for ln in trained if "perf/wait_time_ratio" in ln.metrics]
    stale = [ln.metrics["rollout/staleness/max"] for ln in trained if "rollout/staleness/max" in ln.metrics]
    return {"eval_key": key, "reached_s": reached, "final": evals[-1].metrics[key] if evals else None,
            "train_s": trained[-1].time - start if trained else None,
            "idle_ratio": statistics.mean(idle) if idle else None, "max_staleness": max(stale) if stale else 0.0}


def run(config: str, seed: int, run_dir: Path, flags: list[str]) -> dict:
    command = [sys.executable, "-m", "miles.train", "--config", config, "--seed", str(seed),
               "--run-dir", str(run_dir), *flags]
    started = time.time()
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return {"wall_s": time.time() - started}


def uncorrected_refusal(k: int) -> str:
    try:
        parse_config(["--max-weight-staleness", str(k), "--fully-async"])
    except ConfigError as exc:
        return f"refused: {exc}"
    return "accepted"


def median_or_none(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/tiny-cpu.yaml")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.9, help="held-out pass@1 to reach")
    parser.add_argument("--k", type=int, default=1, help="--max-weight-staleness of the async runs")
    parser.add_argument("--out", default=None, help="run dirs under here (default: runs/async-bench-<time>)")
    parser.add_argument("flags", nargs="*", help="more miles.train flags for both modes, after --")
    args = parser.parse_args()
    out = Path(args.out or ROOT / "runs" / time.strftime("async-bench-%Y%m%d-%H%M%S"))
    modes = {"sync": [], f"async-k{args.k}": ["--fully-async", "--max-weight-staleness", str(args.k), "--use-tis"]}
    rows = []
    for seed in range(1234, 1234 + args.seeds):
        for mode, flags in modes.items():
            run_dir = out / f"{mode}-seed{seed}"
            result = run(args.config, seed, run_dir, [*flags, *args.flags])
            result.update(time_to_target(run_dir, args.target), mode=mode, seed=seed)
            rows.append(result)
            print(f"{mode:>10} seed {seed}: reached {args.target} after {fmt(result['reached_s'])} s, final "
                  f"{fmt(result['final'])}, train {fmt(result['train_s'])} s", flush=True)
    print()
    print(f"{'mode':>10} {'seed':>5} {'to target s':>12} {'train s':>9} {'final pass@1':>13} {'idle':>6} {'stale max':>10}")
    for r in rows:
        print(f"{r['mode']:>10} {r['seed']:>5} {fmt(r['reached_s']):>12} {fmt(r['train_s']):>9} {fmt(r['final']):>13} "
              f"{fmt(r['idle_ratio']):>6} {fmt(r['max_staleness']):>10}")
    summary = {"target": args.target, "seeds": args.seeds, "config": args.config, "k": args.k,
               "eval_key": rows[0].get("eval_key") if rows else None, "uncorrected": uncorrected_refusal(args.k)}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {"median_to_target_s": median_or_none([r["reached_s"] for r in mine]),
                         "reached": sum(r["reached_s"] is not None for r in mine),
                         "median_train_s": median_or_none([r["train_s"] for r in mine]),
                         "median_final": median_or_none([r["final"] for r in mine]),
                         "median_idle_ratio": median_or_none([r["idle_ratio"] for r in mine])}
    a, s = summary[f"async-k{args.k}"]["median_to_target_s"], summary["sync"]["median_to_target_s"]
    summary["ratio_to_target"] = a / s if a is not None and s else None
    a, s = summary[f"async-k{args.k}"]["median_train_s"], summary["sync"]["median_train_s"]
    summary["ratio_train_time"] = a / s if a is not None and s else None
    print(json.dumps(summary))
    return 0


def fmt(value) -> str:
    return "-" if value is None else f"{value:.3g}"


if __name__ == "__main__":
    sys.exit(main())
