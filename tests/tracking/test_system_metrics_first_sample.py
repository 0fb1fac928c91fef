"""Each chunk's delivery process starts its own MLflow system-metrics monitor thread. psutil's cpu_percent()
compares with the calling thread's last call and answers 0.0 on a thread's first, so every chunk's first CPU
sample read 0.0 (first-hour F2: 5 of 9 samples) until the sink measured the monitor thread's first sample."""
from __future__ import annotations

import threading

import mlflow.system_metrics.system_metrics_monitor as smm
import psutil

from miles.tracking.sinks.mlflow_sink import MlflowSink
from tests.support.wait import wait_for

CPU_KEY = "system/cpu_utilization_percentage"


def test_each_chunks_first_cpu_sample_is_measured(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.5")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    busy = threading.Event()

    def burn() -> None:  # a busy core, so a measured sample cannot honestly read 0
        while not busy.is_set():
            sum(range(1000))

    burner = threading.Thread(target=burn, daemon=True)
    burner.start()
    psutil.cpu_percent()  # this thread primed, as before the fix: the monitor's own thread still was not
    try:
        firsts = []
        for chunk in range(2):  # the run's first chunk, then a resumed one (a new monitor thread each)
            sink = MlflowSink({}, uri, "e", run_id=run_id, system_metrics=True)
            sink.open()
            before = len(client.get_metric_history(run_id, CPU_KEY))
            points = wait_for(lambda: client.get_metric_history(run_id, CPU_KEY)[before:], 30,
                              f"chunk {chunk}'s first CPU sample")
            sink.close()
            firsts.append(min(points, key=lambda m: m.step).value)
            client.update_run(run_id, status="RUNNING")  # the next chunk's task reopens it
    finally:
        busy.set()
        burner.join()
    assert all(value > 0 for value in firsts), firsts


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
