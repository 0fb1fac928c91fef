"""Probe N23 (first-hour N4): `miles diagnose` from an ordinary shell on a run whose Ray cluster uses token
auth. It did not present the run's token (Ray sends one to an explicit address only with
RAY_AUTH_MODE=token), so the bundle had no Ray state, and Ray's C++ client printed ~20 lines of
"Failed to get cluster ID from GCS server: Unauthenticated" into the terminal. Now diagnose finds the
token where the run has it (here: RAY_AUTH_TOKEN_PATH in the environment of the run's process) and gets
Ray's state, with nothing of Ray's in the terminal."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import pytest

from miles.config.health import HealthConfig
from miles.diagnose.bundle import collect
from miles.profiling import pyspy
from tests.orchestration.ray_head import base_env, start_head

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def head():
    cluster = start_head(num_cpus=1)
    yield cluster
    cluster.stop()


def test_diagnose_uses_the_runs_ray_token(head, tmp_path, monkeypatch, capfd):
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)  # an ordinary shell: no Ray setting at all
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # and no ~/.ray/auth_token of its own
    # the run's process, with the cluster's token in its environment as a run's Ray workers have it
    run_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                env={**base_env(), "RAY_AUTH_TOKEN_PATH": str(head.token_path)})
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "timeline-open.jsonl").write_text("")
        pyspy.write_processes(run_dir, {"trainer": run_proc.pid})
        (run_dir / "profiler" / "services.json").write_text(json.dumps(
            {"ray": {"gcs_address": head.address}, "engine_urls": [], "router_url": None}))
        diagnosis = collect(run_dir, HealthConfig())
    finally:
        run_proc.kill()
        run_proc.wait()
    notes = "\n".join(diagnosis.verdict["details"])
    assert "Ray state" not in notes and "cannot connect" not in notes, notes
    with tarfile.open(diagnosis.path) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert isinstance(json.loads(files["ray/actors.json"]), list)
    assert isinstance(json.loads(files["ray/workers.json"]), list)
    assert "ray/timeline.json" in files
    status = files["ray/status.txt"].lower()
    # authenticated: a node table, or (a head just started) Ray's "no cluster status" yet, never a refusal
    assert "unauthenticated" not in status and ("node" in status or "no cluster status" in status), status
    assert head.token_path.read_text().strip() not in "".join(files.values())  # the token itself is never packed
    terminal = capfd.readouterr()
    assert "gcs_client" not in terminal.out + terminal.err and "InvalidAuthToken" not in terminal.out + terminal.err
