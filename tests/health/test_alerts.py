"""Red flags reach the trackers: a rate-limited wandb alert (offline run file) and the report's marks."""
from __future__ import annotations

import time

from miles.health.alerts import AlertLimiter, alert_text, alert_title, red_flags_in
from miles.health.report import red_flag_rollouts, write_report
from miles.record.journal import JournalLine
from miles.tracking.sinks.base import Delivery
from miles.tracking.sinks.wandb_sink import WandbSink
from miles.tracking.wandb_files import read_records


def lines():
    """Rollouts 0-3 as the trainer journals them, grad_norm red on 2 and 3."""
    return [JournalLine(i, 1000.0 + i, {"rollout/step": i, "train/step": i, "train/grad_norm": 0.5 + 3 * (i >= 2),
                                        "health/grad_norm": float(i >= 2), "health/loss": 0.0}) for i in range(4)]


def test_red_flags_in_a_line_and_the_alert_words():
    assert red_flags_in({"health/grad_norm": 1.0, "health/loss": 0.0, "train/loss": 3.0}) == ["grad_norm"]
    title = alert_title("train_rollout_logprob_abs_diff", 123456)
    assert len(title) < 64 and title.startswith("miles red flag: train_rollout_logprob_abs_diff")
    text = alert_text("grad_norm", 2, {"train/grad_norm": 3.5})
    assert "train/grad_norm=3.5" in text and "lower --lr" in text


def test_limiter_allows_one_alert_per_signal_per_interval():
    now = [0.0]
    limiter = AlertLimiter(60.0, clock=lambda: now[0])
    assert limiter.allow("loss") and not limiter.allow("loss") and limiter.allow("grad_norm")
    now[0] = 61.0
    assert limiter.allow("loss")


def test_wandb_sink_alerts_once_per_signal(tmp_path):
    sink = WandbSink(params={"health_alert_interval": 300.0}, run_id="alerts1", directory=str(tmp_path),
                     mode="offline", project="health")
    sink.open()
    sink.deliver(Delivery(lines()))
    sink.close()
    path = next(tmp_path.rglob("run-alerts1.wandb"))
    deadline = time.monotonic() + 60
    while True:  # wandb's writer may still be flushing the file after finish() returned
        records = read_records(path)
        if sum(r.WhichOneof("record_type") == "history" for r in records) == 4 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    alerts = [r.alert for r in records if r.WhichOneof("record_type") == "alert"]
    assert [(a.title, a.level) for a in alerts] == [("miles red flag: grad_norm at rollout 2", "ERROR")]
    assert "train/grad_norm=3.5" in alerts[0].text


def test_report_marks_red_flag_rollouts(tmp_path):
    assert red_flag_rollouts(lines(), "grad_norm") == [2, 3] and red_flag_rollouts(lines(), "loss") == []
    assert write_report(lines(), tmp_path / "report.png").stat().st_size > 0
