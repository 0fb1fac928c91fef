"""The health watch on async GRPO: the train/rollout log-prob difference of a rollout with stale tokens
measures the weights' lag, not a numerical mismatch, so it raises no flag there; with no stale token
(a synchronous or staleness-0 rollout) it is judged as always."""
from miles.config.health import HealthConfig
from miles.health import RED
from miles.health.detectors import Rollout, RunFacts, check_logprob_diff

RUN = RunFacts(clip_grad=1.0, groups_per_rollout=32, use_kl_loss=False)


def test_a_stale_rollouts_logprob_diff_is_not_a_red_flag():
    lagging = {"train/train_rollout_logprob_abs_diff": 0.8, "rollout/staleness/max": 1.0}
    assert check_logprob_diff([Rollout(0, lagging)], HealthConfig(), RUN) is None
    fresh = {**lagging, "rollout/staleness/max": 0.0}
    assert check_logprob_diff([Rollout(0, fresh)], HealthConfig(), RUN).severity == RED
    sync = {"train/train_rollout_logprob_abs_diff": 0.8}
    assert check_logprob_diff([Rollout(0, sync)], HealthConfig(), RUN).severity == RED


def test_the_report_shows_an_async_runs_reward_by_staleness(tmp_path):
    from miles.health.report import staleness_panel, write_report
    from miles.record.journal import JournalLine

    lines = [JournalLine(0, 0.0, {"rollout/raw_reward": 0.3, "rollout/reward_by_staleness/0": 0.3}),
             JournalLine(1, 1.0, {"rollout/raw_reward": 0.5, "rollout/reward_by_staleness/0": 0.6,
                                  "rollout/reward_by_staleness/1": 0.4})]
    panel = staleness_panel(lines)
    assert panel.keys == ("rollout/reward_by_staleness/0", "rollout/reward_by_staleness/1")
    assert staleness_panel([JournalLine(0, 0.0, {"rollout/raw_reward": 0.3})]) is None  # a synchronous run
    assert write_report(lines, tmp_path / "report.png").stat().st_size > 0
