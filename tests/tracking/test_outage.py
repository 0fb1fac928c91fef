"""A real MLflow tracking server killed mid-run and restarted on the same port: training goes
on, the failure is reported once, the spooled points arrive when it is back; and with the
server down until the run ends, `miles replay-spool RUN_DIR` delivers them later."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tracking_helpers import REPO, assert_points_equal, charted, journal_points, mlflow_points, subprocess_env
from miles.config import parse_config
from miles.serving.process import free_port
from miles.tracking import open_tracking
from miles.tracking.state import DeliveryState
from synthetic import iterate

pytestmark = pytest.mark.slow
DEADLINE_S = 120.0


@dataclass
class MlflowServer:
    store: Path
    port: int
    proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port",
             str(self.port), "--backend-store-uri", f"sqlite:///{self.store / 'mlflow.db'}",
             "--artifacts-destination", str(self.store / "artifacts"), "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.store,
            # a tracking server for runs' metrics: MLflow's GenAI job runner (three more processes) is not used
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            start_new_session=True)  # its own process group: the server forks uvicorn workers
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "mlflow server exited"
            try:
                if httpx.get(f"{self.uri}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)  # poll interval of the readiness check
        raise TimeoutError(f"mlflow server on {self.uri} not healthy after {DEADLINE_S}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the server and its workers: an outage, not a shutdown
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def mlflow_server(tmp_path):
    store = tmp_path / "mlflow-server"
    store.mkdir()
    server = MlflowServer(store, free_port())
    server.start()
    yield server
    server.stop()


def wait_delivered(run_dir: Path, lines: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    # the delivery process writes the cursors (its file may not exist yet while it starts)
    while (sink := DeliveryState.load(run_dir).sinks.get("mlflow")) is None or sink.cursor < lines:
        assert time.monotonic() < deadline, f"mlflow never got {lines} lines"
        time.sleep(0.1)  # poll interval


def delivery_log(run_dir: Path) -> list[str]:
    path = run_dir / "tracking" / "delivery.log"
    return path.read_text().splitlines() if path.exists() else []


def test_server_outage_mid_run_is_caught_up(run_dir, mlflow_server):
    config = parse_config(["--num-rollout", "8", "--use-mlflow", "--mlflow-tracking-uri", mlflow_server.uri,
                           "--tracking-retry-interval", "0.5"])
    tracker = open_tracking(config, run_dir)
    tracker.open({})
    iterate(tracker, config, range(0, 3))
    wait_delivered(run_dir, 3)
    mlflow_server.stop()
    iterate(tracker, config, range(3, 8))  # training goes on while the tracker is down
    deadline = time.monotonic() + DEADLINE_S
    while not any("mlflow failed" in line for line in delivery_log(run_dir)):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert DeliveryState.load(run_dir).sinks["mlflow"].cursor < 8
    mlflow_server.start()
    wait_delivered(run_dir, 8)
    assert tracker.close() == {}
    failures = [line for line in delivery_log(run_dir) if "mlflow failed" in line]
    assert len(failures) == 1, failures  # reported once per outage
    assert any("mlflow is back" in line for line in delivery_log(run_dir))
    want = journal_points(run_dir)
    assert_points_equal("mlflow", mlflow_points(run_dir, want), charted(want))


def test_spool_outliving_the_run_is_replayed_by_command(run_dir, mlflow_server):
    config = parse_config(["--num-rollout", "5", "--use-mlflow", "--mlflow-tracking-uri", mlflow_server.uri,
                           "--tracking-retry-interval", "0.5", "--tracking-close-timeout", "1"])
    tracker = open_tracking(config, run_dir)
    tracker.open({})
    iterate(tracker, config, range(0, 2))
    wait_delivered(run_dir, 2)
    mlflow_server.stop()
    iterate(tracker, config, range(2, 5))
    assert tracker.close() == {"mlflow": 3}  # the run ends first; nothing is lost

    mlflow_server.start()
    replay = subprocess.run([sys.executable, "-m", "flows.cli", "replay-spool", str(run_dir),  # the server trusted
                             "--mlflow-tracking-uri", mlflow_server.uri], cwd=REPO,
                            env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    state = DeliveryState.load(run_dir)
    assert state.sinks["mlflow"].cursor == 5 and state.sinks["mlflow"].uploaded
    want = journal_points(run_dir)
    assert_points_equal("mlflow", mlflow_points(run_dir, want), charted(want))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    run_id = state.sinks["mlflow"].spec.options["run_id"]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert "report.png" in {a.path for a in client.list_artifacts(run_id)}
    again = subprocess.run([sys.executable, "-m", "flows.cli", "replay-spool", str(run_dir)], cwd=REPO,
                           env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "holds all 5" in again.stdout  # idempotent
