"""The straggler signal's calibration: healthy 2-rank runs must raise no straggler flag, and a run
with an injected slow rank must name that rank and phase.

    .venv/bin/python benchmarks/straggler_calibration.py [--seeds 3] [--rollouts 12] [--slow-s 2]
        [--slow-at 6] [--out DIR] [-- FLAGS]

Real runs of the plain driver (`python -m miles.train --config configs/tiny-cpu.yaml`, evals off),
interleaved seed by seed so both backends see the same machine load: FSDP with
`--actor-num-gpus-per-node 2` and Megatron with 2 data-parallel ranks, each over --seeds seeds
with the default health bounds (`--health-straggler-slowdown` 1.5, `--health-straggler-lag-s` 0.25,
`--health-straggler-window` 3); then one FSDP run with `--inject-fault
slow-rank:1:forward:SLOW_S@SLOW_AT`. The fault fires in one rollout, and a single slow rollout is by
design no flag at the default window, so that run sets `--health-straggler-window 1` (its figures
are also judged at the default window, by `miles doctor`'s replay). Per run, from its journal and
`health.jsonl`: each phase's largest slowdown (max / median of the ranks' own work) and largest lag
(max - median, seconds) over its rollouts, the rollouts in which one phase straggled past both
bounds (what a window of 1 would flag), the rollouts flagged when the journal is replayed at
windows 1 to 5, and the straggler flags the live watch raised; for the
injected run the rank and phase the flag, `miles doctor` and `miles diagnose` name. Prints a table,
then one JSON line with every run's figures. A rerun with the same --out reuses the runs that
finished there (a loaded machine can time out Ray's start: such a run is tried twice).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from miles.config.health import HealthConfig  # noqa: E402
from miles.health.detectors import Rollout  # noqa: E402
from miles.health.straggler import check_straggler, phases, slowest_rank, straggler_in  # noqa: E402
from miles.record.journal import count_rollouts, read_journal  # noqa: E402
from miles.record.layout import RunLayout  # noqa: E402

MILES = [str(Path(sys.executable).parent / "miles")]  # the venv's `miles` command
BACKENDS = {"fsdp": ["--train-backend", "fsdp"], "megatron": ["--train-backend", "megatron"]}


def train(run_dir: Path, seed: int, flags: list[str]) -> float | None:
    """One real run; its wall seconds (start-up included), None when `run_dir` already holds it
    finished (a rerun with the same --out goes on where one stopped). A run that fails before its
    first rollout (Ray's start timed out on the loaded machine) is tried once more."""
    rollouts = int(flags[flags.index("--num-rollout") + 1])
    if count_rollouts(run_dir) == rollouts:
        return None
    command = [sys.executable, "-m", "miles.train", "--config", "configs/tiny-cpu.yaml",
               "--actor-num-gpus-per-node", "2", "--eval-interval", "none", "--seed", str(seed),
               "--run-dir", str(run_dir), *flags]
    for attempt in (1, 2):
        shutil.rmtree(run_dir, ignore_errors=True)
        started = time.time()
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        if done.returncode == 0:
            return time.time() - started
        if attempt == 2 or count_rollouts(run_dir):
            break
        print(f"{run_dir.name}: failed before its first rollout, once more", flush=True)
    raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def phase_figures(run_dir: Path) -> dict:
    """Each phase's largest slowdown and lag over the run, and the (rollout, phase, rank) in which
    a phase straggled past the default bounds (a window of 1 would flag each)."""
    cfg = HealthConfig()
    slowdown: dict[str, float] = {}
    lag: dict[str, float] = {}
    straggles = []
    for line in read_journal(RunLayout(run_dir).journal):
        m = line.metrics
        for phase in phases(m):
            key = f"straggler/{phase}/"
            slowdown[phase] = max(slowdown.get(phase, 0.0), m[key + "slowdown"])
            lag[phase] = max(lag.get(phase, 0.0), m[key + "max"] - m[key + "median"])
            rank = straggler_in(m, phase, cfg)
            if rank:
                straggles.append({"rollout": line.rollout_id, "phase": phase, "rank": rank})
    return {"max_slowdown": slowdown, "max_lag_s": lag, "straggles": straggles}


def flags_by_window(run_dir: Path, windows=(1, 2, 3, 4, 5)) -> dict[int, int]:
    """How many rollouts the straggler signal would flag, replayed at each window with the default
    bounds (the live watch ran at the run's own window)."""
    history = [Rollout(ln.rollout_id, ln.metrics) for ln in read_journal(RunLayout(run_dir).journal)
               if ln.rollout_id >= 0]
    counts = {}
    for w in windows:
        cfg = replace(HealthConfig(), health_straggler_window=w)
        counts[w] = sum(check_straggler(history[: i + 1], cfg, None) is not None
                        for i in range(len(history)))
    return counts


def live_flags(run_dir: Path) -> list[dict]:
    """The straggler red flags the run's own health watch raised (health.jsonl)."""
    path = RunLayout(run_dir).health
    lines = [json.loads(t) for t in path.read_text().splitlines() if t] if path.exists() else []
    flags = []
    for v in (x for x in lines if x["signal"] == "straggler" and x["severity"] == "red"):
        (phase,) = {k.split("/")[1] for k in v["values"] if k.endswith("/slowdown")}
        flags.append({"rollout": v["rollout_id"], "phase": phase,
                      "rank": slowest_rank(v["values"], phase), "message": v["message"]})
    return flags


def doctor_row(run_dir: Path, flags: list[str]) -> str:
    """`miles doctor`'s straggler row, with the run's settings or `flags` replayed."""
    out = subprocess.run([*MILES, "doctor", str(run_dir), *flags], cwd=ROOT, text=True,
                         capture_output=True).stdout
    return next((ln.strip() for ln in out.splitlines() if ln.startswith("straggler")), "")


def diagnose_lines(run_dir: Path) -> list[str]:
    """What `miles diagnose` says of the training ranks (its bundle goes to RUN_DIR/diagnose/)."""
    out = subprocess.run([*MILES, "diagnose", "--json", str(run_dir)], cwd=ROOT, text=True,
                         capture_output=True).stdout
    return json.loads(out)["verdict"].get("ranks", [])


def one_run(out: Path, backend: str, seed: int, fault: str | None, extra: list[str]) -> dict:
    name = f"{backend}-seed{seed}" + ("-slow-rank" if fault else "")
    flags = [*BACKENDS[backend], *extra]
    if fault:
        flags += ["--inject-fault", fault, "--health-straggler-window", "1"]
    run_dir = out / name
    row = {"run": name, "backend": backend, "seed": seed, "fault": fault,
           "load_before": os.getloadavg()[0], "wall_s": train(run_dir, seed, flags)}
    row.update(phase_figures(run_dir), flags=live_flags(run_dir), run_dir=str(run_dir),
               flags_by_window=flags_by_window(run_dir),
               load_after=os.getloadavg()[0])
    if fault:
        row["doctor_window_1"] = doctor_row(run_dir, [])
        row["doctor_default_window"] = doctor_row(run_dir, ["--health-straggler-window", "3"])
        row["diagnose"] = diagnose_lines(run_dir)
    wall = "finished before" if row["wall_s"] is None else f"{row['wall_s']:.0f} s"
    print(f"{name}: {wall}, {len(row['flags'])} straggler flags, "
          f"{len(row['straggles'])} single-rollout straggles", flush=True)
    return row


def table(rows: list[dict]) -> None:
    names = sorted({p for r in rows for p in r["max_slowdown"]})
    print(f"\n{'run':<24}{'flags':>6}{'w=1..5':>11}  " + "".join(f"{p:>18}" for p in names))
    print(f"{'':<24}{'':>6}{'':>11}  " + "".join(f"{'slowdown / lag s':>18}" for _ in names))
    for r in rows:
        cells = "".join(f"{r['max_slowdown'].get(p, 0):>10.2f} / {r['max_lag_s'].get(p, 0):>5.2f}"
                        for p in names)
        by_window = ",".join(str(n) for n in r["flags_by_window"].values())
        print(f"{r['run']:<24}{len(r['flags']):>6}{by_window:>11}  {cells}")
    for r in rows:
        for f in r["flags"]:
            print(f"{r['run']}: flag at rollout {f['rollout']}: {f['message']}")
        for key in ("doctor_window_1", "doctor_default_window"):
            if key in r:
                print(f"{r['run']}: doctor ({key[7:]}): {r[key]}")
        for line in r.get("diagnose", []):
            print(f"{r['run']}: diagnose: {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rollouts", type=int, default=12,
                        help="rollouts per run (12: four disjoint windows of the default 3)")
    parser.add_argument("--slow-s", type=float, default=2.0, help="the injected rank's sleep")
    parser.add_argument("--slow-at", type=int, default=6, help="the rollout it sleeps in")
    parser.add_argument("--out", default=None,
                        help="run dirs under here (default: runs/straggler-calibration-<time>)")
    parser.add_argument("flags", nargs="*", help="more miles.train flags for every run, after --")
    args = parser.parse_args()
    out = Path(args.out or ROOT / "runs" / time.strftime("straggler-calibration-%Y%m%d-%H%M%S"))
    extra = ["--num-rollout", str(args.rollouts), *args.flags]
    rows = [one_run(out, backend, seed, None, extra)
            for seed in range(1234, 1234 + args.seeds) for backend in BACKENDS]
    fault = f"slow-rank:1:forward:{args.slow_s:g}@{args.slow_at}"
    rows.append(one_run(out, "fsdp", 1234, fault, extra))
    table(rows)
    healthy = [r for r in rows if not r["fault"]]
    print(json.dumps({"rollouts": args.rollouts, "seeds": args.seeds, "fault": fault,
                      "healthy_runs": len(healthy),
                      "healthy_flags": sum(len(r["flags"]) for r in healthy),
                      "healthy_single_rollout_straggles": sum(len(r["straggles"]) for r in healthy),
                      "runs": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
