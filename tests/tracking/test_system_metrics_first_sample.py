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


def test_network_counters_continue_over_chunks(tmp_path):
    """A chunk's monitor (resume) counts network bytes from the run's first monitor's counters, kept as a
    run tag, so system/network_* does not fall to 0 at every chunk."""
    from mlflow.tracking import MlflowClient

    from miles.tracking.sinks.mlflow_sink import NETWORK_BASELINE_TAG

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id

    def network_monitor(resume: bool):
        sink = MlflowSink({}, uri, "e", run_id=run_id, system_metrics=True)
        sink.client = client  # what open() sets
        monitor = smm.SystemMetricsMonitor(run_id, resume_logging=resume, tracking_uri=uri)
        sink.monitor = monitor
        sink._continue_network_counters(resume)
        return next(m for m in monitor.monitors if type(m).__name__ == "NetworkMonitor")

    first = network_monitor(resume=False)
    recv, sent = map(float, client.get_run(run_id).data.tags[NETWORK_BASELINE_TAG].split(","))
    assert (recv, sent) == (round(first._initial_receive_megabytes, 6), round(first._initial_transmit_megabytes, 6))
    loopback_traffic(2_000_000)  # bytes between the two monitors: a restarted count would start past them
    psutil_now = psutil.net_io_counters()
    assert psutil_now.bytes_recv / 1e6 >= recv + 1.9
    later = network_monitor(resume=True)  # the next chunk's monitor
    assert later._initial_receive_megabytes == recv <= psutil_now.bytes_recv / 1e6
    assert later._initial_transmit_megabytes == sent


def loopback_traffic(size: int) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as client:
            peer, _ = server.accept()
            with peer:
                client.sendall(b"x" * size)
                client.shutdown(socket.SHUT_WR)
                while peer.recv(1 << 16):
                    pass
