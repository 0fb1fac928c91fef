"""Issue 54: `miles diagnose` names the slowest training rank and phase of a slow run from the
journal's straggler metrics; a run with even ranks gets a line saying so, a one-rank run none.
Run dirs built by hand (a dead run: no process to dump)."""
from __future__ import annotations

import json

from miles.config.health import HealthConfig
from miles.diagnose.bundle import collect
from miles.diagnose.slowest_rank import slowest_rank_lines
from miles.record import layout
from miles.record.journal import JournalLine

CFG = HealthConfig()


def straggler_row(rollout_id: int, phase: str, seconds: list[float], dps: list[int]) -> dict:
    """One journal row with `straggler/<phase>/*` of ranks node 0 / dp `dps` / pp 0 / tp 0."""
    ordered = sorted(seconds)
    mid = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
    slowest = max(range(len(seconds)), key=lambda i: seconds[i])
    key = f"straggler/{phase}/"
    return {"rollout_id": rollout_id, "time": 1.0 + rollout_id, "perf/train_time": sum(seconds),
            key + "min": ordered[0], key + "median": mid, key + "max": ordered[-1],
            key + "slowdown": ordered[-1] / mid, key + "slowest_node": 0,
            key + "slowest_dp": dps[slowest], key + "slowest_pp": 0, key + "slowest_tp": 0}


def dead_run(tmp_path, rows) -> dict:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / layout.JOURNAL).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return collect(run_dir, CFG).verdict


def test_diagnose_names_the_slowest_rank_and_phase_of_a_slow_run(tmp_path):
    rows = [straggler_row(i, "backward", [0.5, 0.5, 0.5, 2.5], [0, 1, 2, 3]) for i in range(1, 5)]
    rows.insert(0, straggler_row(0, "backward", [0.5, 0.52, 0.49, 0.51], [0, 1, 2, 3]))
    rows[2] = {**rows[2], **{k: v for k, v in straggler_row(2, "forward", [3.0, 0.4, 0.4, 0.4],
                                                             [0, 1, 2, 3]).items() if "/" in k}}
    verdict = dead_run(tmp_path, rows)
    line = next(d for d in verdict["details"] if d.startswith("slowest rank"))
    assert "node0/dp3/pp0/tp0" in line and "`backward`" in line and "in 4 of 5 rollouts" in line
    assert "5.00x" in line and verdict["ranks"] == [line]


def test_even_ranks_are_said_even_and_one_rank_says_nothing(tmp_path):
    # millisecond jitter: 1.64x, but 3.5 ms above the median
    rows = [straggler_row(i, "optimizer", [0.002, 0.009], [0, 1]) for i in range(3)]
    verdict = dead_run(tmp_path, rows)
    (line,) = verdict["ranks"]
    assert line.startswith("training ranks even: no straggler in 3 rollouts")
    assert "`optimizer`" in line
    assert "node0/dp1/pp0/tp0" in line and line in verdict["details"]
    one_rank = [JournalLine(i, 1.0 + i, {"perf/train_time": 1.0}) for i in range(3)]
    assert slowest_rank_lines(one_rank, CFG) == []
