"""C8b: a non-finite metric (an eval mean overflowed by 1e308 rewards, a NaN) keeps the journal strict JSON:
recorded as null with its name under `non_finite`, and every reader takes it the same way."""
from __future__ import annotations

import json
import math

import pytest

from miles.config import parse_config
from miles.dashboard.run_files import RunFiles
from miles.dashboard.views import run_summary
from miles.health import HealthWatch
from miles.health.cli import main as doctor
from miles.record.journal import Journal, JournalFollower, JournalLine, read_journal, strict_json


def strict_loads(text: str):
    """json.loads that refuses NaN/Infinity, as strict JSON readers (browsers, jq, Go) do."""
    def refuse(name):
        raise ValueError(f"bare {name}")
    return json.loads(text, parse_constant=refuse)


def test_a_non_finite_metric_is_null_and_named(tmp_path):
    journal = Journal(tmp_path)
    journal.append(JournalLine(0, 1.0, {"eval/reward": math.inf, "train/loss": math.nan, "train/lr": 1e-6}))
    raw = strict_loads((tmp_path / "metrics.jsonl").read_text())
    assert raw == {"rollout_id": 0, "time": 1.0, "train/lr": 1e-6, "eval/reward": None, "train/loss": None,
                   "non_finite": ["eval/reward", "train/loss"]}
    for lines in (read_journal(tmp_path / "metrics.jsonl"), JournalFollower(tmp_path / "metrics.jsonl").read()):
        assert lines == [JournalLine(0, 1.0, {"train/lr": 1e-6}, ("eval/reward", "train/loss"))]  # what trackers get
    assert strict_loads(strict_json({"eval/pass@1": -math.inf, "n": 2.0})) == {
        "eval/pass@1": None, "n": 2.0, "non_finite": ["eval/pass@1"]}


def test_a_journal_from_before_is_read_the_same_way(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"rollout_id": 0, "time": 1.0, "eval/reward": Infinity, "x": 1.0}\n')
    assert read_journal(tmp_path / "metrics.jsonl") == [JournalLine(0, 1.0, {"x": 1.0}, ("eval/reward",))]
    assert RunFiles(tmp_path).journal().rows == [{"rollout_id": 0, "time": 1.0, "x": 1.0,
                                                   "non_finite": ["eval/reward"]}]


def test_health_watch_doctor_and_dashboard_agree(tmp_path, capsys):
    config = parse_config(["--run-dir", str(tmp_path)])
    watch = HealthWatch(config, tmp_path)
    line = {"train/loss": 0.1, "eval/reward": math.inf}
    report = watch.observe(0, line)
    assert [v.signal for v in report.red] == ["non_finite"]
    assert "eval/reward" in report.red[0].message and "check the reward function's range" in capsys.readouterr().out
    Journal(tmp_path).append(JournalLine(0, 1.0, {**line, **report.metrics}))
    (tmp_path / "tracking").mkdir()
    (tmp_path / "tracking" / "config.yaml").write_text("{}\n")
    assert doctor([str(tmp_path)]) == 1  # a red flag, replayed from the null the journal holds
    assert next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("non_finite")).split()[1:3] == [
        "RED", "0"]
    assert run_summary(RunFiles(tmp_path), follow=False)["non_finite"] == ["eval/reward"]


@pytest.mark.slow
def test_a_1e308_reward_keeps_the_run_files_strict(tmp_path, capsys, ray_cluster):
    from miles.train import main

    run_dir = tmp_path / "run"  # python -m miles.train's main, in this process on the shared Ray
    code = main(["--run-dir", str(run_dir), "--num-rollout", "1", "--custom-rm-path", "tests.health.broken_rewards.huge"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err[-3000:]
    # rewards that overflow make the first gradient NaN: the run stops, says why, and still prints its scorecard
    assert code == 1 and "non-finite gradient norm" in err, err[-3000:]
    card = out[out.index(f"python -m miles.train: scorecard of {run_dir}"):]
    assert "rollouts       none trained" in card and "no checkpoint saved" in card
    lines = [strict_loads(text) for text in (run_dir / "metrics.jsonl").read_text().splitlines()]
    base = next(ln for ln in lines if ln["rollout_id"] == -1)
    assert base["non_finite"] and all(base[name] is None for name in base["non_finite"]), base
    assert strict_loads((run_dir / "base_eval.json").read_text())["non_finite"] == base["non_finite"]
