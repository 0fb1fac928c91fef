"""A real pretrained checkpoint learning on CPU: held-out pass@1 before and after, wall time, the rollout-0
train/rollout log-prob diff, and the peak RSS of every process of the run.

    .venv/bin/python benchmarks/pretrained.py [--config configs/smollm2-cpu.yaml] [--train-backend fsdp] [-- FLAGS]

One invocation runs `python -m miles.train --config CONFIG` (the plain driver; FLAGS after `--` are passed on)
as a child process and, every --poll seconds, reads the kernel's high-water mark of resident memory
(`VmHWM` in /proc/PID/status: the true peak, not a sample of it) of each process of the run's tree: the
driver, the Ray processes it starts, the trainer ranks, the engine and the router. Each process keeps the
last mark read before it ended; processes are grouped by role. The learning figures come from the run's
journal. Prints a table, then one JSON line with the figures.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from miles.record.journal import read_journal  # noqa: E402
from miles.record.layout import RunLayout  # noqa: E402
from miles.run.scorecard import scorecard  # noqa: E402


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set size so far, in MB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def role(cmdline: list[str]) -> str:
    """A readable name for a process of the run, from its command line (Ray workers name their actor)."""
    text = " ".join(cmdline)
    actor = re.match(r"ray::(\w+)", text)
    if actor:
        return f"ray actor {actor.group(1)}"
    module = re.search(r"-m\s+([\w.]+)", text)
    if module:
        return module.group(1) if module.group(1) != "miles.train" else "driver (python -m miles.train)"
    # a worker's command line names the raylet too: default_worker is looked for first
    for name in ("default_worker", "gcs_server", "raylet", "dashboard", "log_monitor", "monitor.py", "runtime_env"):
        if name in text:
            return f"ray {name.removesuffix('.py')}"
    return Path(cmdline[0]).name if cmdline else "?"


# names a later look may improve on. "?": an empty command line, read in the moment after exec (Popen has
# returned) before the kernel has set the new program's arguments; seen on a loaded machine
GENERIC = ("ray default_worker", "ray actor IDLE", "python", "?")


def better_role(known: str, seen: str) -> str:
    """The name to keep for a process known as `known` and now seen as `seen`: an actor's name once it has one,
    anything over a generic name, and never an empty one."""
    if seen == "?":
        return known
    if seen.startswith("ray actor") and seen != "ray actor IDLE" or known in GENERIC:
        return seen
    return known


def watch(proc: subprocess.Popen, poll: float) -> dict[int, dict]:
    """Peak RSS per process of `proc`'s tree until it exits: pid -> {role, peak_mb}."""
    seen: dict[int, dict] = {}
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in tree:
            mark = peak_rss_mb(p.pid)
            if mark is None:
                continue
            try:  # read each time: a Ray worker's title names its actor only once the actor is made
                name = role(p.cmdline())
            except psutil.Error:
                continue
            entry = seen.setdefault(p.pid, {"role": name, "peak_mb": 0.0})
            entry["role"] = better_role(entry["role"], name)
            entry["peak_mb"] = max(entry["peak_mb"], mark)
        time.sleep(poll)
    return seen


def learning(run_dir: Path) -> dict:
    """The run's scorecard figures (held-out eval base -> final, reward first -> last, rollouts trained),
    plus what only this benchmark reports: every eval point, rollout 0's log-prob diff, median phase times."""
    card = scorecard(run_dir)
    trained = [ln for ln in read_journal(RunLayout(run_dir).journal) if ln.rollout_id >= 0]
    first = next((ln.metrics for ln in trained if ln.rollout_id == 0), {})

    def median_of(key: str) -> float | None:
        values = [ln.metrics[key] for ln in trained if key in ln.metrics]
        return statistics.median(values) if values else None

    return {
        "eval_key": card.eval_key,
        "pass_at_1_before": card.base_eval,
        "pass_at_1_after": card.final_eval,
        "after_rollout": card.final_eval_rollout,
        "evals": [(ln.rollout_id, round(ln.metrics[card.eval_key], 4)) for ln in trained if card.eval_key in ln.metrics],
        "rollouts": len(card.rollouts),
        "reward_first": card.reward_first[1] if card.reward_first else None,
        "reward_last": card.reward_last[1] if card.reward_last else None,
        "logprob_diff_rollout0": first.get("train/train_rollout_logprob_abs_diff"),
        "median_rollout_s": median_of("perf/rollout_time"),
        "median_train_s": median_of("perf/train_time"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/smollm2-cpu.yaml")
    parser.add_argument("--train-backend", default="fsdp", choices=["fsdp", "megatron"])
    parser.add_argument("--run-dir", default=None, help="default: runs/pretrained-<backend>-<time>")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between reads of the memory marks")
    parser.add_argument("flags", nargs="*", help="more miles.train flags, after --")
    args = parser.parse_args()
    run_dir = Path(args.run_dir or ROOT / "runs" / f"pretrained-{args.train_backend}-{time.strftime('%Y%m%d-%H%M%S')}")
    command = [sys.executable, "-m", "miles.train", "--config", args.config, "--train-backend", args.train_backend,
               "--run-dir", str(run_dir), *args.flags]
    print("running:", " ".join(command), flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT)
    peaks = watch(proc, args.poll)
    wall = time.perf_counter() - start
    if proc.wait() != 0:
        print(f"the run failed (exit {proc.returncode}); see {run_dir}", file=sys.stderr)
        return proc.returncode
    figures = learning(run_dir)
    by_role: dict[str, float] = {}
    for entry in peaks.values():
        by_role[entry["role"]] = max(by_role.get(entry["role"], 0.0), entry["peak_mb"])
    rows = [("config", f"{args.config} ({args.train_backend})"), ("wall time (s)", f"{wall:.0f}"),
            ("rollouts", figures["rollouts"]),
            (f"held-out {figures['eval_key']} before", figures["pass_at_1_before"]),
            (f"held-out pass@1 after rollout {figures['after_rollout']}", figures["pass_at_1_after"]),
            ("evals (rollout, pass@1)", figures["evals"]),
            ("rollout/raw_reward first -> last", f"{figures['reward_first']} -> {figures['reward_last']}"),
            ("rollout 0 train/rollout log-prob abs diff", figures["logprob_diff_rollout0"]),
            ("median rollout / train time per rollout (s)", f"{figures['median_rollout_s']} / {figures['median_train_s']}")]
    rows += [(f"peak RSS {name} (MB)", f"{mb:.0f}") for name, mb in sorted(by_role.items(), key=lambda kv: -kv[1])]
    width = max(len(str(r[0])) for r in rows)
    for name, value in rows:
        print(f"{str(name):<{width}}  {value}")
    print(json.dumps({**figures, "config": args.config, "train_backend": args.train_backend, "wall_s": round(wall, 1),
                      "peak_rss_mb": {k: round(v) for k, v in by_role.items()}, "run_dir": str(run_dir)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
