"""Each chunk's delivery process starts its own MLflow system-metrics monitor; psutil's first cpu_percent()
in a process is 0.0, so the sink primes it before the monitor's first sample (no 0 at every chunk)."""
from __future__ import annotations

import mlflow.system_metrics.system_metrics_monitor as smm
import psutil

from miles.tracking.sinks.mlflow_sink import MlflowSink


def test_cpu_percent_is_primed_before_the_monitor_samples(monkeypatch):
    calls = []
    monkeypatch.setattr(psutil, "cpu_percent", lambda *a, **k: calls.append("cpu_percent") or 0.0)

    class Monitor:
        def __init__(self, run_id, resume_logging, tracking_uri):
            self.resume = resume_logging

        def start(self):
            calls.append("start")

    monkeypatch.setattr(smm, "SystemMetricsMonitor", Monitor)
    sink = MlflowSink({}, "sqlite:///unused.db", "e", run_id="r", system_metrics=True)
    sink._start_system_metrics(resume=True)
    assert calls == ["cpu_percent", "start"] and sink.monitor.resume is True
