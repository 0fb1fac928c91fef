"""Per signal: a synthetic healthy stream (smooth and noisy) stays silent, a red-flag stream fires within its window."""
from __future__ import annotations

import math

import pytest

from miles.config.health import HealthConfig
from miles.health import RED, WARNING, RunFacts, judge, replay
from miles.health.watch import active_signals, health_metrics
from tests.health.synthetic_streams import CFG, RUN, START, broken, stream


def flagged(rollouts, cfg=CFG, run=RUN):
    return replay(rollouts, cfg, run)


@pytest.mark.parametrize("noise", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_streams_raise_nothing(noise, seed):
    assert flagged(stream(noise, seed)) == []


RED_STREAMS = {
    # signal: (changes from START on, rollouts within which it must fire)
    "loss": (dict(train__loss=lambda i, v: v + 5.0 if i == 0 else v), 1),
    "raw_reward": (dict(rollout__raw_reward=lambda i, v: 1.0, rollout__raw_reward_std=lambda i, v: 0.0,
                        **{"rollout__zero_std/count_1.0": lambda i, v: 32.0,
                           "rollout__zero_std/count_0.0": lambda i, v: 0.0}), CFG.health_raw_reward_window),
    "kl_loss": (dict(train__kl_loss=lambda i, v: 0.2), 1),
    "train_rollout_logprob_abs_diff": (dict(train__train_rollout_logprob_abs_diff=lambda i, v: 0.6), 1),
    "entropy_loss": (dict(train__entropy_loss=lambda i, v: v * 0.5 ** (i + 1)), CFG.health_entropy_loss_window),
    "grad_norm": (dict(train__grad_norm=lambda i, v: 8.0 + i), CFG.health_grad_norm_window),
    "pg_clipfrac": (dict(train__pg_clipfrac=lambda i, v: 0.7), 1),
    "stall": (dict(perf__step_time=lambda i, v: 1000.0 if i == 0 else v), 1),
    "router_errors": (dict(rollout__router_errors=lambda i, v: 40.0, rollout__router_retries=lambda i, v: 10.0), 1),
    "truncated_ratio": (dict(rollout__truncated_ratio=lambda i, v: 0.9), 1),
    "engine_flapping": (dict(rollout__engine_restarts=lambda i, v: 1.0), CFG.health_engine_flap_restarts),
    "abort_storm": (dict(rollout__aborted_ratio=lambda i, v: 0.5), 1),
    "degenerate_groups": (dict(rollout__degenerate_group_ratio=lambda i, v: 1.0),
                          CFG.health_degenerate_groups_window),
}


@pytest.mark.parametrize("signal", sorted(RED_STREAMS))
@pytest.mark.parametrize("noise", [0.0, 1.0])
def test_red_flag_fires_within_its_window(signal, noise):
    changes, within = RED_STREAMS[signal]
    verdicts = flagged(broken(stream(noise), START, **changes))
    reds = [v for v in verdicts if v.signal == signal and v.severity == RED]
    assert reds, f"{signal} never fired"
    assert START <= reds[0].rollout_id < START + within
    assert all(v.rollout_id >= START for v in verdicts), "something fired on the healthy part"


def test_loss_and_grad_norm_non_finite_fire_at_once():
    verdicts = flagged(broken(stream(), START, train__loss=lambda i, v: math.nan,
                              train__grad_norm=lambda i, v: math.inf))
    firsts = {}
    for v in verdicts:
        firsts.setdefault(v.signal, v.rollout_id)
    assert firsts["loss"] == START and firsts["grad_norm"] == START


def test_logprob_diff_climbing_is_a_warning():
    verdicts = flagged(broken(stream(), START, train__train_rollout_logprob_abs_diff=lambda i, v: 0.01 * 1.3 ** i))
    mine = [v for v in verdicts if v.signal == "train_rollout_logprob_abs_diff"]
    assert mine[0].severity == WARNING and mine[0].rollout_id < START + CFG.health_logprob_diff_window
    assert any(v.severity == RED for v in mine)  # and red once past the ceiling


def test_pg_clipfrac_warning_then_red():
    rollouts = broken(stream(0.0), START, train__pg_clipfrac=lambda i, v: 0.3 if i < 3 else 0.6)
    mine = [(v.rollout_id, v.severity) for v in flagged(rollouts) if v.signal == "pg_clipfrac"]
    assert mine[:4] == [(START, WARNING), (START + 1, WARNING), (START + 2, WARNING), (START + 3, RED)]


def test_time_imbalance_is_a_warning_after_its_window():
    rollouts = broken(stream(0.0), START, perf__rollout_time=lambda i, v: 100.0)
    mine = [v for v in flagged(rollouts) if v.signal == "rollout_train_time"]
    assert mine[0].severity == WARNING and mine[0].rollout_id == START + CFG.health_time_window - 1


def test_an_async_rollout_is_balanced_by_its_generation_not_the_wait():
    """Issue 55, N23: generated ahead, a rollout's perf/rollout_time is the trainer's wait for it
    (0.2 ms when the overlap works); its generation (perf/rollout_generate_time) is what train_time
    balances."""
    overlapped = broken(stream(0.0), START, perf__rollout_time=lambda i, v: 0.0002,
                        perf__rollout_generate_time=lambda i, v: 1.5)
    assert [v for v in flagged(overlapped) if v.signal == "rollout_train_time"] == []
    slow = broken(stream(0.0), START, perf__rollout_time=lambda i, v: 0.0002,
                  perf__rollout_generate_time=lambda i, v: 100.0)
    mine = [v for v in flagged(slow) if v.signal == "rollout_train_time"]
    assert mine and mine[0].message.startswith("rollout_generate_time at least")


def test_kl_loss_judged_only_with_use_kl_loss():
    rollouts = broken(stream(), START, train__kl_loss=lambda i, v: 5.0)
    no_kl = RunFacts(clip_grad=1.0, groups_per_rollout=32, use_kl_loss=False)
    assert [v for v in flagged(rollouts, run=no_kl) if v.signal == "kl_loss"] == []
    assert "health/kl_loss" not in health_metrics([], no_kl)


def test_thresholds_follow_the_flags():
    rollouts = broken(stream(0.0), START, rollout__truncated_ratio=lambda i, v: 0.3)
    assert not [v for v in flagged(rollouts) if v.severity == RED]
    strict = HealthConfig(health_truncated_ratio=0.25)
    assert [v.signal for v in flagged(rollouts, cfg=strict) if v.severity == RED][0] == "truncated_ratio"


def test_health_metrics_are_0_or_1_per_signal():
    rollouts = broken(stream(0.0), START, train__pg_clipfrac=lambda i, v: 0.9)
    metrics = health_metrics(judge(rollouts[: START + 1], CFG, RUN), RUN)
    assert metrics["health/pg_clipfrac"] == 1.0
    assert set(metrics.values()) == {0.0, 1.0} and len(metrics) == len(active_signals(RUN))


def test_one_engine_restart_is_a_warning_and_a_flapping_engine_red():
    once = broken(stream(0.0), START, rollout__engine_restarts=lambda i, v: 1.0 if i == 0 else 0.0)
    mine = [(v.rollout_id, v.severity) for v in flagged(once) if v.signal == "engine_flapping"]
    assert mine == [(START, WARNING)]
    flapping = broken(stream(0.0), START, rollout__engine_restarts=lambda i, v: 1.0 if i % 2 == 0 else 0.0)
    mine = [(v.rollout_id, v.severity) for v in flagged(flapping) if v.signal == "engine_flapping"]
    assert mine[:3] == [(START, WARNING), (START + 2, WARNING), (START + 4, RED)]


def test_abort_storm_warns_from_half_its_share_and_degenerate_groups_warn_before_red():
    few = broken(stream(0.0), START, rollout__aborted_ratio=lambda i, v: CFG.health_abort_storm_share * 0.6)
    assert {(v.signal, v.severity) for v in flagged(few)} == {("abort_storm", WARNING)}
    one = broken(stream(0.0), START, rollout__degenerate_group_ratio=lambda i, v: 1.0 if i == 0 else 0.0)
    assert [(v.rollout_id, v.signal, v.severity) for v in flagged(one)] == [(START, "degenerate_groups", WARNING)]
