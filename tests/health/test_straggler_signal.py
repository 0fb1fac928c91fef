"""The straggler signal on synthetic journal lines: one rank slow in one phase for
--health-straggler-window rollouts in a row is a red flag naming the rank's coordinates and the
phase; jitter, a lone slow step and a slow rank that changes every rollout are not; `miles doctor`
has its row."""
from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

from miles.config.health import HealthConfig
from miles.health import RED, replay
from miles.health.cli import main as doctor
from miles.health.watch import health_metrics
from tests.health.synthetic_streams import CFG, RUN, START, stream
from tests.support.runs import recorded

W = CFG.health_straggler_window


def phase_metrics(phase: str, seconds: list[float], dps: list[int]) -> dict[str, float]:
    """`straggler/<phase>/*` as the trainer logs them for ranks at node 0, dp `dps`, pp 0, tp 0."""
    ordered = sorted(seconds)
    mid = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
    slowest = max(range(len(seconds)), key=lambda i: seconds[i])
    key = f"straggler/{phase}/"
    return {key + "min": ordered[0], key + "median": mid, key + "max": ordered[-1],
            key + "slowdown": ordered[-1] / mid, key + "slowest_node": 0.0,
            key + "slowest_dp": float(dps[slowest]), key + "slowest_pp": 0.0,
            key + "slowest_tp": 0.0}


def with_ranks(seed: int = 0, slow=None, ranks: int = 2) -> list:
    """The healthy stream with every rank's forward and optimizer times (a few % jitter);
    `slow(rollout_id)` -> (dp, extra seconds) or None slows one rank's forward in that rollout (with
    two ranks the median is their mean: 0.8 s and 3.8 s are a slowdown of 1.65)."""
    rng = random.Random(seed)
    out = []
    for r in stream(seed=seed):
        forward = [0.8 * (1 + rng.uniform(-0.05, 0.05)) for _ in range(ranks)]
        optimizer = [0.004 * (1 + rng.uniform(-0.9, 0.9)) for _ in range(ranks)]  # ms: wild ratios
        if slow and (hit := slow(r.rollout_id)):
            forward[hit[0]] += hit[1]
        metrics = {**r.metrics, **phase_metrics("forward", forward, list(range(ranks))),
                   **phase_metrics("optimizer", optimizer, list(range(ranks)))}
        out.append(dataclasses.replace(r, metrics=metrics))
    return out


def stragglers(rollouts, cfg=CFG):
    return [v for v in replay(rollouts, cfg, RUN) if v.signal == "straggler"]


def test_healthy_ranks_with_jitter_raise_no_straggler_flag():
    for seed in range(3):
        rollouts = with_ranks(seed)
        assert any(r.metrics["straggler/optimizer/slowdown"] > CFG.health_straggler_slowdown
                   for r in rollouts), "the millisecond phase must jitter past the bound"
        assert stragglers(rollouts) == []
        assert stragglers(with_ranks(seed, ranks=4)) == []


def test_one_slow_rank_is_flagged_after_its_window_with_coordinates_and_phase():
    rollouts = with_ranks(slow=lambda i: (1, 3.0) if i >= START else None)
    flags = stragglers(rollouts)
    assert flags and flags[0].rollout_id == START + W - 1
    assert all(v.severity == RED for v in flags) and len(flags) == len(rollouts) - (START + W - 1)
    first = flags[0]
    assert "node0/dp1/pp0/tp0" in first.message and "forward" in first.message
    assert first.values["straggler/forward/slowest_dp"] == 1.0
    assert "node0/dp1/pp0/tp0" in first.line() and "straggler" in first.line()
    assert health_metrics([first], RUN)["health/straggler"] == 1.0


def test_a_slow_rank_on_four_ranks_is_named_by_its_dp():
    rollouts = with_ranks(slow=lambda i: (2, 0.9) if i >= START else None, ranks=4)
    flags = stragglers(rollouts)
    assert flags and flags[0].rollout_id == START + W - 1 and "dp2" in flags[0].message


def test_a_lone_slow_step_or_a_changing_rank_is_not_a_straggler():
    lone = with_ranks(slow=lambda i: (0, 3.0) if START <= i < START + W - 1 else None)
    assert stragglers(lone) == []
    changing = with_ranks(slow=lambda i: (i % 2, 3.0) if i >= START else None)
    assert stragglers(changing) == []


def test_the_lag_floor_and_the_bounds_are_flags():
    small = with_ranks(slow=lambda i: (1, 0.2) if i >= START else None)  # 1.25x, 0.2 s: under both
    assert stragglers(small) == []
    strict = HealthConfig(health_straggler_slowdown=1.05, health_straggler_lag_s=0.05,
                          health_straggler_window=1)
    flags = stragglers(small, strict)
    assert flags and flags[0].rollout_id == START
    lax = HealthConfig(health_straggler_lag_s=5.0)
    assert stragglers(with_ranks(slow=lambda i: (1, 3.0) if i >= START else None), lax) == []


def test_doctor_has_a_straggler_row(tmp_path, capsys):
    recorded(tmp_path / "slow", with_ranks(slow=lambda i: (1, 3.0) if i >= START else None))
    recorded(tmp_path / "even", with_ranks())
    recorded(tmp_path / "one", stream())
    rows = {}
    for name in ("slow", "even", "one"):
        code = doctor([str(tmp_path / name)])
        out = capsys.readouterr().out
        rows[name] = (code, next(ln for ln in out.splitlines() if ln.startswith("straggler ")))
    code, row = rows["slow"]
    assert code == 1 and row.split()[1:3] == ["RED", str(START + W - 1)]
    assert "straggler/forward/slowest_dp=1" in row
    code, row = rows["even"]
    assert code == 0 and row.split()[1] == "ok" and "largest lag " in row
    code, row = rows["one"]  # one rank: no straggler figures, the signal is off
    assert code == 0 and row.split()[1] == "off" and "straggler/<phase>/slowdown" in row


def test_on_red_flag_stop_and_profile_react_to_a_straggler(tmp_path):
    from miles.config import parse_config
    from miles.health import HealthWatch
    from miles.run.observer import IterationResult
    from miles.run.red_flags import RedFlagProfiler, RedFlagStopper

    class Profiler:
        def __init__(self):
            self.windows = []

        def request_window(self, start, end):
            self.windows.append((start, end))
            return SimpleNamespace(start=start, end=end)

    config = parse_config(["--on-red-flag", "stop"])
    watch, stopper = HealthWatch(config, tmp_path), RedFlagStopper(config)
    profiler = Profiler()
    profiling = RedFlagProfiler(parse_config(["--on-red-flag", "profile"]), profiler)
    reasons = []
    for r in with_ranks(slow=lambda i: (1, 3.0) if i >= START else None)[: START + W]:
        report = watch.observe(r.rollout_id, r.metrics)
        result = IterationResult(r.rollout_id, r.metrics, [], report)
        reasons.append(stopper.after_iteration(result))
        profiling.after_iteration(result)
    assert reasons[:-1] == [None] * (START + W - 1)  # nothing before the window held
    assert "straggler at rollout" in reasons[-1] and "node0/dp1/pp0/tp0" in reasons[-1]
    assert profiler.windows == [(START + W, START + W + 2)]  # --health-profile-rollouts 2
