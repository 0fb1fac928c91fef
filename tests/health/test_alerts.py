"""Red flags reach the trackers: a rate-limited wandb alert (offline run file) and the report's marks."""
from __future__ import annotations

import time

from miles.health.alerts import AlertLimiter, alert_text, alert_title, red_flags_in
from miles.health.report import red_flag_rollouts, report_figure, write_report
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


def test_report_leads_with_the_eval_pass_at_k_from_the_base_eval_on():
    evals = {-1: 0.229, 19: 0.613, 39: 0.747, 59: 0.796}  # as the first-hour review's run journaled them
    journal = [JournalLine(-1, 999.0, {"eval/step": 0.0, "eval/arithmetic-pass_at_1": evals[-1],
                                       "eval/arithmetic-pass_at_4": 0.4})]
    for i in range(60):
        metrics = {"rollout/step": i, "train/step": i, "train/loss": 0.1}
        if i in evals:
            metrics.update({"eval/step": float(i), "eval/arithmetic-pass_at_1": evals[i],
                            "eval/arithmetic-pass_at_4": 0.5})
        journal.append(JournalLine(i, 1000.0 + i, metrics))
    first = report_figure(journal, title="run").axes[0]
    assert first.get_title() == "held-out eval pass@k: arithmetic-pass_at_1 0.229 -> 0.796"
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in first.get_lines()}
    assert curves["eval/arithmetic-pass_at_1"] == ([0.0, 19.0, 39.0, 59.0], list(evals.values()))
    assert curves["eval/arithmetic-pass_at_4"][0] == [0.0, 19.0, 39.0, 59.0] and first.get_xlabel() == "eval/step"
    # a run without evals has no such panel: the first is the loss
    assert report_figure(journal[1:2]).axes[0].get_title() == "loss"
