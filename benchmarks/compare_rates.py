"""How often `miles compare`'s default rules cry wolf and how often they miss, side by side in one
run: false alarms on healthy pairs and misses on injected regressions, over seeds, short and long
runs, and one to three baselines.

    .venv/bin/python benchmarks/compare_rates.py [--runs DIR ...] [--short 6]

The healthy runs are real journals: the recorded seeds of the compare tests
(`tests/compare/recorded/seeds/*`, `recorded/default-1`: 8 rollouts of the CI gate's flags) and any
finished run directory given with --runs (e.g. longer runs of other seeds, made once with
`python -m miles.train --num-rollout 16 --eval-interval 4 --eval-max-prompts 64 --seed S` and kept
under ~/.cache/miles/compare-rates/, which is read by default). Each run is judged, cut to its first
--short rollouts ("short") and whole ("long"), against the next 1, 2 and 3 runs of the same length
as baselines. A healthy pair is the run itself: any learning signal failing is a false alarm. An
injected regression is a copy of the run's curves with one fault written in from the middle step on:
- reward_halved: `rollout/raw_reward` halved (the issue's case);
- reward_drift: the reward falling by 15% of itself more each rollout;
- reward_flat: a reward that never moves (every step the run's first value, eval pass@k its base);
- entropy_collapse: `train/entropy_loss` at 30%, 10%, 3% of itself over the last three steps;
- lr_high: `train/grad_norm` 10 times and `train/loss` up by half of |loss| + 0.1 (an LR far too
  high), or, where `lr-high/` is among the runs (a real `--lr 0.1` run), that run itself.
The issue's own case is reported apart: a copy of seed 1 with its reward halved from rollout 3,
6 rollouts, against seeds 1 and 2. The last line is one JSON object with the rates.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles.compare.comparison import compare  # noqa: E402
from miles.compare.curves import RunCurves, read_run  # noqa: E402
from miles.compare.rules import DEFAULT_RULES  # noqa: E402

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "compare" / "recorded"
CACHE = Path.home() / ".cache" / "miles" / "compare-rates"
REWARD, ENTROPY = "rollout/raw_reward", "train/entropy_loss"
GRAD, LOSS = "train/grad_norm", "train/loss"


def cut(run: RunCurves, n: int | None) -> RunCurves:
    """The run as it stood after its first n rollouts (None: whole)."""
    if n is None:
        return run
    curves = {k: {s: v for s, v in pts.items() if s < n} for k, pts in run.curves.items()}
    reached = {a: min(s, n - 1) for a, s in run.reached.items()}
    return RunCurves(run.name, run.source, curves, reached)


def edited(run: RunCurves, key: str, change) -> RunCurves:
    """A copy with `change(step, value, steps)` applied to every point of `key`."""
    curves = {k: dict(v) for k, v in run.curves.items()}
    steps = sorted(curves.get(key, {}))
    curves[key] = {s: change(s, v, steps) for s, v in curves.get(key, {}).items()}
    return RunCurves(run.name + "+fault", run.source, curves, run.reached)


def middle(steps: list[int]) -> int:
    return steps[len(steps) // 2]


def halved(run):
    return edited(run, REWARD, lambda s, v, st: v * 0.5 if s >= middle(st) else v)


def drift(run):
    return edited(run, REWARD, lambda s, v, st: max(0.0, v * (1 - 0.15 * (s - middle(st) + 1)))
                  if s >= middle(st) else v)


def flat(run):
    out = edited(run, REWARD, lambda s, v, st: run.curves[REWARD][st[0]])
    for key in [k for k in run.curves if k.startswith("eval/") and "pass_at" in k]:
        out = edited(out, key, lambda s, v, st, key=key: run.curves[key][st[0]])
    return out


def collapse(run):
    shares = (0.3, 0.1, 0.03)
    return edited(run, ENTROPY, lambda s, v, st: v * shares[st.index(s) - len(st) + 3]
                  if s in st[-3:] else v)


def lr_high(run):
    out = edited(run, GRAD, lambda s, v, st: v * 10 if s >= middle(st) else v)
    return edited(out, LOSS, lambda s, v, st: v + 0.5 * abs(v) + 0.1 if s >= middle(st) else v)


FAULTS = {"reward_halved": halved, "reward_drift": drift, "reward_flat": flat,
          "entropy_collapse": collapse, "lr_high": lr_high}


def fails(run: RunCurves, baselines: list[RunCurves]) -> list[str]:
    """The learning signals that fail the comparison (what decides `miles compare`'s exit code)."""
    return [s.key for s in compare(run, baselines, DEFAULT_RULES).failed]


def healthy_runs(extra: list[Path]) -> list[RunCurves]:
    dirs = sorted((RECORDED / "seeds").iterdir()) + [RECORDED / "default-1"]
    dirs += [d for root in extra for d in sorted(root.iterdir()) if (d / "done").exists()
             and d.name != "lr-high"]
    return [read_run(d) for d in dirs]


def judge_all(runs: list[RunCurves], short: int, real_lr_high: RunCurves | None) -> dict:
    """{(length, baselines): {"healthy": [pairs, alarms], fault: [cases, caught]}}."""
    table: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    by_len = defaultdict(list)
    for run in runs:
        n = max(run.reached.values()) + 1
        by_len[n].append(run)
    for n, group in sorted(by_len.items()):
        for length, limit in (("short", short), ("long", None)):
            if length == "long" and n <= short:
                continue
            cut_group = [cut(r, limit) for r in group]
            label = f"{length} ({limit or n})"
            for k in (1, 2, 3):
                if len(cut_group) <= k:
                    continue
                for i, run in enumerate(cut_group):
                    bases = [cut_group[(i + j) % len(cut_group)] for j in range(1, k + 1)]
                    row = table[(label, k)]
                    row["healthy"][0] += 1
                    row["healthy"][1] += bool(fails(run, bases))
                    for name, fault in FAULTS.items():
                        bad = fault(run)
                        if name == "lr_high" and real_lr_high is not None and n == 8:
                            bad = cut(real_lr_high, limit)
                        row[name][0] += 1
                        row[name][1] += bool(fails(bad, bases))
    return table


def issue_case() -> list[str]:
    seed1, seed2 = (cut(read_run(RECORDED / "seeds" / s), 6) for s in ("seed-1", "seed-2"))
    bad = edited(seed1, REWARD, lambda s, v, st: v * 0.5 if s >= 3 else v)
    return fails(bad, [seed1, seed2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="*", default=[CACHE] if CACHE.is_dir() else [])
    parser.add_argument("--short", type=int, default=6, help="rollouts of a short run (default 6)")
    args = parser.parse_args(argv)
    runs = healthy_runs(args.runs)
    lr_dir = next((r / "lr-high" for r in args.runs if (r / "lr-high" / "done").exists()), None)
    table = judge_all(runs, args.short, read_run(lr_dir) if lr_dir else None)
    names = ["healthy", *FAULTS]
    print(f"{len(runs)} healthy runs; lr_high: {'the real --lr 0.1 run' if lr_dir else 'injected'} "
          f"(8-rollout groups)")
    print(f"{'length':<12} {'bases':>5}  " + "  ".join(f"{n:>16}" for n in names))
    totals = defaultdict(lambda: [0, 0])
    for (label, k), row in sorted(table.items()):
        cells = []
        for n in names:
            cases, hits = row[n]
            totals[n][0] += cases
            totals[n][1] += hits
            cells.append(f"{hits:>3}/{cases:<3} {'alarms' if n == 'healthy' else 'caught':>8}")
        print(f"{label:<12} {k:>5}  " + "  ".join(f"{c:>16}" for c in cells))
    case = issue_case()
    print(f"the issue's case (seed 1 halved from rollout 3 vs seeds 1, 2; 6 rollouts): "
          f"{'regression: ' + ', '.join(case) if case else 'within (missed)'}")
    injected = [totals[n] for n in FAULTS]
    summary = {"healthy_pairs": totals["healthy"][0], "false_alarms": totals["healthy"][1],
               "injected": sum(c for c, _ in injected), "caught": sum(h for _, h in injected),
               "by_fault": {n: {"cases": totals[n][0], "caught": totals[n][1]} for n in FAULTS},
               "issue_case_caught": bool(case), "runs": len(runs), "real_lr_high": bool(lr_dir)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
