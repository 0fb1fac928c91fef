"""The live watch (WARN line at onset, health.jsonl, health/<signal> metrics, resume) and `miles doctor`
replaying the same journal to the same verdicts, from RUN_DIR and from MLflow."""
from __future__ import annotations

import json

import yaml

from miles.config import parse_config, redacted_flat_dict
from miles.health.cli import main as doctor
from miles.health import HEALTH_LOG, HealthWatch, read_health_log
from miles.record.journal import JournalLine, read_journal
from miles.tracking.state import CONFIG_ARTIFACT
from tests.health.synthetic_streams import START, broken, stream

CONFIG = parse_config([])


def clipfrac_run():
    """A healthy stream whose pg_clipfrac goes red from rollout START on."""
    return broken(stream(), START, train__pg_clipfrac=lambda i, v: 0.8)


def run_live(run_dir, rollouts, config=CONFIG):
    """Feed rollouts to the watch as the trainer does: judge the line, journal it with the health metrics."""
    watch = HealthWatch(config, run_dir)
    watch.resume([])
    journal = run_dir / "metrics.jsonl"
    reports = []
    for r in rollouts:
        metrics = {"rollout/step": r.rollout_id, **r.metrics}
        report = watch.observe(r.rollout_id, metrics)
        with journal.open("a") as f:
            f.write(JournalLine(r.rollout_id, float(r.rollout_id), {**metrics, **report.metrics}).to_json() + "\n")
        reports.append(report)
    (run_dir / CONFIG_ARTIFACT).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_ARTIFACT).write_text(yaml.safe_dump(redacted_flat_dict(config)))
    return reports


def test_red_flag_warns_once_logs_every_rollout_and_sets_the_metric(tmp_path, capsys):
    reports = run_live(tmp_path, clipfrac_run())
    warn = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[health] WARN")]
    assert len(warn) == 1  # at the onset only
    assert "pg_clipfrac at rollout 30" in warn[0] and "train/pg_clipfrac=0.8" in warn[0] and "drop the LR" in warn[0]
    logged = [json.loads(t) for t in (tmp_path / HEALTH_LOG).read_text().splitlines()]
    assert {tuple(sorted(e)) for e in logged} == {("message", "rollout_id", "severity", "signal", "values")}
    assert [e["rollout_id"] for e in logged] == list(range(START, len(reports)))
    assert all(e["signal"] == "pg_clipfrac" and e["severity"] == "red" for e in logged)
    assert reports[START - 1].metrics["health/pg_clipfrac"] == 0.0
    assert reports[START].metrics["health/pg_clipfrac"] == 1.0
    assert reports[START].started and not reports[START + 1].started


def test_resume_drops_verdicts_of_redone_rollouts_and_keeps_history(tmp_path):
    run_live(tmp_path, clipfrac_run()[: START + 5])
    lines = [ln for ln in read_journal(tmp_path / "metrics.jsonl") if ln.rollout_id <= START + 1]
    watch = HealthWatch(CONFIG, tmp_path)
    watch.resume(lines)  # the journal was cut back to the checkpoint of rollout START + 1
    assert [v.rollout_id for v in read_health_log(tmp_path)] == [START, START + 1]
    assert len(watch.history) == START + 2 and watch.flagged == {"pg_clipfrac": "red"}


def test_watch_off_judges_nothing(tmp_path):
    config = parse_config(["--health-watch", "off"])
    reports = run_live(tmp_path, clipfrac_run(), config)
    assert all(not r.verdicts and not r.metrics for r in reports)
    assert not (tmp_path / HEALTH_LOG).exists()


def test_doctor_replays_the_journal_to_the_live_verdicts(tmp_path, capsys):
    run_live(tmp_path, clipfrac_run())
    live = read_health_log(tmp_path)
    capsys.readouterr()
    assert doctor([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("pg_clipfrac"))
    assert row.split()[1:4] == ["RED", str(START), str(len(live))]
    assert "red flags: pg_clipfrac" in out


def test_doctor_passes_a_healthy_run(tmp_path, capsys):
    run_live(tmp_path, stream())
    assert doctor([str(tmp_path)]) == 0
    assert "red flags: none" in capsys.readouterr().out


def test_doctor_shows_the_figures_behind_an_ok_row(tmp_path, capsys):
    rollouts = stream()
    run_live(tmp_path, rollouts)
    capsys.readouterr()
    assert doctor([str(tmp_path)]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[2:-1]}
    entropy = [r.metrics["train/entropy_loss"] for r in rollouts]
    assert rows["entropy_loss"].split()[1] == "ok"
    assert f"entropy_loss {entropy[0]:.3g}->{entropy[-1]:.3g} [{min(entropy):.3g}, {max(entropy):.3g}]" \
        in rows["entropy_loss"]
    clipped = sum(r.metrics["train/grad_norm"] >= CONFIG.train.clip_grad for r in rollouts)
    assert f">=clip_grad in {clipped}/{len(rollouts)}" in rows["grad_norm"]
    # a signal the run is not judged on has its row, saying why, rather than none
    assert rows["kl_loss"].split()[1] == "off" and "no --use-kl-loss" in rows["kl_loss"]
    # a signal with nothing logged (this stream has no engine restarts) is not judged either: the same
    # verdict and wording as kl_loss, never an "ok" that rests on no figures (first-hour N20)
    assert "rollout/engine_restarts" not in rollouts[0].metrics
    assert rows["engine_flapping"].split()[1] == "off"
    assert "not judged: the journal has no rollout/engine_restarts" in rows["engine_flapping"]
    assert not any(r.split()[1] == "ok" and "not logged" in r for r in rows.values())
    assert rows["non_finite"].endswith(f"non-finite values in 0 of {len(rollouts)} rollouts")


def test_doctor_uses_the_runs_own_thresholds(tmp_path, capsys):
    config = parse_config(["--health-pg-clipfrac-red", "0.9", "--health-pg-clipfrac-warn", "0.85"])
    run_live(tmp_path, clipfrac_run(), config)
    assert doctor([str(tmp_path)]) == 0  # 0.8 is below this run's own thresholds


def test_doctor_replays_an_mlflow_run(tmp_path, capsys):
    from miles.tracking.sinks.base import Delivery
    from miles.tracking.sinks.mlflow_sink import MlflowSink

    run_live(tmp_path, clipfrac_run())
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sink = MlflowSink(params=redacted_flat_dict(CONFIG), tracking_uri=uri, experiment="health",
                      artifact_dir=str(tmp_path / "mlartifacts"))
    sink.open()
    sink.deliver(Delivery(read_journal(tmp_path / "metrics.jsonl")))
    tags = sink.client.get_run(sink.run_id).data.tags
    sink.close()
    assert tags["miles.health.pg_clipfrac"] == f"red flag at rollout {START}" and tags["miles.health"] == "red"
    capsys.readouterr()
    assert doctor([sink.run_id, "--mlflow-tracking-uri", uri]) == 1
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("pg_clipfrac"))
    assert row.split()[1:4] == ["RED", str(START), str(len(read_health_log(tmp_path)))]


def test_doctor_env_checks_stay(capsys, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert doctor(["--env"]) == 0
    assert "all required checks passed" in capsys.readouterr().out


def test_doctor_names_a_bad_target(tmp_path):
    import pytest

    from miles.config import ConfigError

    with pytest.raises(ConfigError, match="RUN_DIR: .*needs --mlflow-tracking-uri"):
        doctor([str(tmp_path / "missing")])
    with pytest.raises(ConfigError, match="has no metrics.jsonl"):
        doctor([str(tmp_path)])
