"""Probes N40, N45: `miles replay-spool` trusted the MLflow server a run dir's state files name. It sent the
user's MLflow credentials (MLFLOW_TRACKING_USERNAME/PASSWORD) to whatever `tracking_uri` delivery.json held,
and wrote the run's artifacts wherever that server's `artifact_uri` pointed on this machine (or into the
current directory when it gave none).

Now a remote server is used only when it is the one the user configured (--mlflow-tracking-uri, else
MLFLOW_TRACKING_URI): any other is one line, exit 2, before a single request. And a server's artifact location
on this machine outside the run dir is refused the same way before anything is written.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.tracking.tracking_helpers import subprocess_env

from .spooled_runs import edit_delivery

PASSWORD = "n40-mlflow-password-5c1e"


class FakeMlflow:
    """A loopback listener that records every request (and its headers) and answers the two calls an
    MLflow client makes to resume a run: runs/get (with the artifact location it is told) and runs/update."""

    def __init__(self, artifact_uri: str | None = None):
        self.requests: list[tuple[str, str, dict]] = []
        self.artifact_uri = artifact_uri
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _info(self) -> dict:
                info = {"run_id": "r1", "run_uuid": "r1", "experiment_id": "1", "status": "FINISHED",
                        "start_time": 1, "lifecycle_stage": "active"}
                return {**info, "artifact_uri": fake.artifact_uri} if fake.artifact_uri is not None else info

            def do_GET(self):
                fake.requests.append(("GET", self.path, dict(self.headers)))
                self._answer({"run": {"info": self._info(), "data": {"tags": []}}} if "runs/get" in self.path else {})

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                fake.requests.append(("POST", self.path, dict(self.headers)))
                self._answer({"run_info": self._info()} if "runs/update" in self.path else {})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def point_mlflow_at(run_dir: Path, url: str) -> None:
    """The probe's edit: the MLflow tracker's server is `url`, and every line is still to be delivered."""
    def change(state):
        state["sinks"]["mlflow"]["spec"]["options"]["tracking_uri"] = url
        for sink in state["sinks"].values():
            sink["cursor"], sink["uploaded"] = 0, False
    edit_delivery(run_dir, change)


def replay_with(run_dir: Path, *args: str, **env: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "flows.cli", "replay-spool", str(run_dir), "--timeout", "5", *args],
                          cwd=env.pop("cwd"), capture_output=True, text=True, timeout=300,
                          env=subprocess_env(MLFLOW_TRACKING_USERNAME="alice", MLFLOW_TRACKING_PASSWORD=PASSWORD,
                                             **env))


@pytest.mark.parametrize("configured", [None, "http://127.0.0.1:1"])
def test_a_server_only_the_run_dir_names_gets_no_request(run_copy, tmp_path, configured):
    with FakeMlflow() as fake:
        point_mlflow_at(run_copy, fake.url)
        env = {"MLFLOW_TRACKING_URI": configured} if configured else {}
        done = replay_with(run_copy, cwd=str(tmp_path), **env)  # (unfixed, MLflow wrote artifacts into the cwd)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("miles replay-spool: error:") and fake.url in line and "--mlflow-tracking-uri" in line
    assert fake.requests == []  # no request at all, so no credential either
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.parametrize("artifact_uri", ["file://{elsewhere}", "{elsewhere}", None])
def test_a_trusted_servers_artifact_location_outside_the_run_dir_is_refused(run_copy, tmp_path, artifact_uri):
    elsewhere, cwd = tmp_path / "elsewhere", tmp_path / "cwd"
    elsewhere.mkdir()
    cwd.mkdir()
    uri = artifact_uri.format(elsewhere=elsewhere) if artifact_uri else None
    with FakeMlflow(uri) as fake:
        point_mlflow_at(run_copy, fake.url)
        done = replay_with(run_copy, "--mlflow-tracking-uri", fake.url + "/", cwd=str(cwd))  # a slash is the same server
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "artifact location" in line and "outside the run dir" in line and "--allow-dir" in line, line
    assert any("runs/get" in path for _, path, _ in fake.requests)  # the server the user named was asked
    assert not any("log-batch" in path or "artifacts" in path for _, path, _ in fake.requests)
    assert list(elsewhere.iterdir()) == [] and list(cwd.iterdir()) == []


def test_a_trusted_servers_artifact_location_inside_allow_dir_is_used(run_copy, tmp_path):
    """The run's owner can still let a local artifact store outside the run dir through."""
    from miles.tracking.sinks.mlflow_sink import MlflowSink, local_artifact_path

    elsewhere = tmp_path / "elsewhere"
    sink = MlflowSink(params={}, tracking_uri="http://127.0.0.1:1", experiment="x")
    sink.write_roots = [run_copy.resolve(), elsewhere.resolve()]
    sink._check_artifact_location(f"file://{elsewhere}/1/r1/artifacts")  # inside --allow-dir: no error
    sink._check_artifact_location("mlflow-artifacts:/1/r1/artifacts")  # through the server: not this machine
    sink._check_artifact_location("s3://bucket/1/r1/artifacts")
    assert local_artifact_path("s3://bucket/x") is None and local_artifact_path("") == Path(".").resolve()


def test_the_runs_delivery_process_talks_only_to_the_server_its_trainer_gave_it(run_copy, tmp_path):
    """`replay-spool --follow` (what a trainer starts) reads the specs from trainer.json too: a remote
    server there must be the one the trainer handed it in MLFLOW_TRACKING_URI."""
    path = run_copy / "tracking" / "trainer.json"
    with FakeMlflow() as fake:
        trainer = json.loads(path.read_text())
        trainer["trackers"]["mlflow"]["options"]["tracking_uri"] = fake.url
        path.write_text(json.dumps(trainer))
        done = replay_with(run_copy, "--follow", cwd=str(tmp_path), MLFLOW_TRACKING_URI="http://127.0.0.1:1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert fake.url in done.stderr and "trainer.json" in done.stderr and fake.requests == []
