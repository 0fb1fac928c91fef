"""Probes N19-N27 (and the first-hour N4-N6): what `miles diagnose` trusts of a run dir.

- N19/N20: files that resolve outside the run dir (a `metrics.jsonl` linking to a private file, a
  `tracking/` or `profiler/` linking to another folder) are neither read nor packed; the notes name them.
- N21, DG1: the router admin token goes only to a router whose port a listed process of the run listens on
  and whose command line is a miles router's;
  engine /health and /metrics get no token; a URL off this machine is not probed at all.
- N22: a GCS that accepts TCP but never answers costs one bounded wait; the bundle is still written, and
  Ray's C++ client prints nothing into the terminal.
- N25-N27: a folder that is not a run, a `diagnose/` that links elsewhere, an `--out` that is a directory
  or in a missing folder: one line, exit 2, nothing written.
- N5/N6: the `miles train` driver is "driver" (not "mlflow-ui" for its `--use-mlflow`); a cleanly
  finished run is "finished", not "dead ... 5 of 6".
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flows.cli import main as miles
from miles.config.health import HealthConfig
from miles.diagnose.bundle import collect
from miles.diagnose.run_state import RunState
from miles.diagnose.verdict import Findings, compose
from miles.profiling import pyspy

SECRET = "diag-private-7d41c2"
TOKEN = "diag-admin-token-9a3f0e"


def files_of(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def run_dir_with(tmp_path: Path, **processes: int) -> Path:
    """A run dir as a trainer leaves it at start: its phase starts and its process list."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "timeline-open.jsonl").write_text("")
    pyspy.write_processes(run_dir, processes)
    return run_dir


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def test_files_that_link_out_of_the_run_dir_are_not_packed(tmp_path):
    private = tmp_path / "private.jsonl"  # journal-shaped, so a reader would take it
    private.write_text("".join(json.dumps({"rollout_id": i, "time": 1.0 + i, "machine": SECRET}) + "\n"
                               for i in range(3)))
    other = tmp_path / "other"
    (other / "py-spy").mkdir(parents=True)
    (other / "config.yaml").write_text(f"password_hint: {SECRET}\nnum_rollout: 3\n")
    (other / "delivery.log").write_text(f"log line {SECRET}\n")
    (other / "services.json").write_text(json.dumps({"router_url": f"http://127.0.0.1:1/{SECRET}"}))
    run_dir = run_dir_with(tmp_path)
    (run_dir / "metrics.jsonl").symlink_to(private)
    (run_dir / "tracking").symlink_to(other)
    (run_dir / "health.jsonl").symlink_to(private)
    diagnosis = collect(run_dir, HealthConfig())
    packed = files_of(diagnosis.path)
    assert not any(SECRET.encode() in data for data in packed.values()), [n for n, d in packed.items() if SECRET.encode() in d]
    notes = "\n".join(diagnosis.verdict["details"])
    for rel in ("metrics.jsonl", "tracking/config.yaml", "tracking/delivery.log", "health.jsonl"):
        assert f"left out RUN_DIR/{rel}: it resolves outside the run dir" in notes, notes
    # profiler/ linking out: its process list and services are not read either (no pid, no URL taken)
    run_dir2 = tmp_path / "run2"
    run_dir2.mkdir()
    (run_dir2 / "timeline-open.jsonl").write_text("")
    (run_dir2 / "profiler").symlink_to(other)
    diagnosis = collect(run_dir2, HealthConfig())
    assert not any(SECRET.encode() in data for data in files_of(diagnosis.path).values())
    assert "left out RUN_DIR/profiler/services.json" in "\n".join(diagnosis.verdict["details"])


class Listener:
    """A loopback HTTP listener that records each request's path and Authorization header."""

    def __init__(self):
        self.seen: list[tuple[str, str | None]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append((self.path, self.headers.get("authorization")))
                body = b'{"urls": []}'
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def write_services(run_dir: Path, **services) -> None:
    (run_dir / "profiler" / "services.json").write_text(json.dumps(services))


def test_the_admin_token_goes_to_no_url_the_run_dir_merely_names(tmp_path, sleeper, monkeypatch):
    monkeypatch.setenv("MILES_ROUTER_ADMIN_TOKEN", TOKEN)
    listener = Listener()  # in this test's process: not a process of the run's list
    try:
        run_dir = run_dir_with(tmp_path, trainer=sleeper.pid)
        write_services(run_dir, engine_urls=[listener.url, "http://192.0.2.1:80"], router_url=listener.url)
        diagnosis = collect(run_dir, HealthConfig())
    finally:
        listener.close()
    paths = [p for p, _ in listener.seen]
    assert "/health" in paths and "/list_workers" in paths  # still probed: it is on this machine
    assert all(auth is None for _, auth in listener.seen), listener.seen  # but no token, anywhere
    engines = diagnosis.verdict["engines"]
    assert "192.0.2.1 is not this machine" in engines[1]["error"]  # off this machine: not asked at all


LISTENER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[1], "a") as f:
            f.write(json.dumps([self.path, self.headers.get("authorization")]) + "\\n")
        self.send_response(200); self.send_header("content-length", "2"); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a): pass
server = HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_a_listed_listener_that_is_no_router_gets_no_token(tmp_path, sleeper, monkeypatch):
    """DG1: the run dir names the listener's own pid as the router and its port as the router's URL;
    listening there is not enough: its command line is no miles router's."""
    monkeypatch.setenv("MILES_ROUTER_ADMIN_TOKEN", TOKEN)
    log = tmp_path / "listener.jsonl"
    listener = subprocess.Popen([sys.executable, "-c", LISTENER, str(log)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(listener.stdout.readline())
        run_dir = run_dir_with(tmp_path, trainer=sleeper.pid, router=listener.pid)
        write_services(run_dir, engine_urls=[], router_url=f"http://127.0.0.1:{port}")
        diagnosis = collect(run_dir, HealthConfig())
    finally:
        listener.kill()
        listener.wait()
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert ["/list_workers", None] in seen and all(auth is None for _, auth in seen), seen
    assert f"router http://127.0.0.1:{port} lists {{}}" in diagnosis.verdict["details"]  # asked, without a token


def test_the_runs_own_router_gets_the_token(tmp_path, sleeper, monkeypatch):
    """The rule is not "never": a miles router listed in the run's process list, listening on the named
    port, gets the token (its /list_workers answers 200 only with it)."""
    monkeypatch.setenv("MILES_ROUTER_ADMIN_TOKEN", TOKEN)
    router = subprocess.Popen([sys.executable, "-m", "miles.router.cli", "--host", "127.0.0.1", "--port", "0",
                               "--worker-urls", "http://127.0.0.1:9"], stdout=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    try:
        url = next(line for line in router.stdout if "listening on" in line).split()[4]
        run_dir = run_dir_with(tmp_path, trainer=sleeper.pid, router=router.pid)
        write_services(run_dir, engine_urls=[], router_url=url)
        diagnosis = collect(run_dir, HealthConfig())
        monkeypatch.delenv("MILES_ROUTER_ADMIN_TOKEN")  # the router's own token, from its environment
        again = collect(run_dir, HealthConfig())
    finally:
        router.kill()
        router.wait()
    for answer in (diagnosis, again):  # /list_workers answered (a 401 would be "router: /list_workers: 401 ...")
        lines = [d for d in answer.verdict["details"] if d.startswith(("router http", "router:"))]
        assert len(lines) == 1 and lines[0].startswith(f"router {url} lists") and "127.0.0.1:9" in lines[0], lines


def test_a_gcs_that_never_answers_costs_one_bounded_wait(tmp_path, sleeper, monkeypatch, capfd):
    from miles.diagnose import ray_view

    monkeypatch.setattr(ray_view, "RAY_DEADLINE_S", 6.0)
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)  # accepts TCP (the kernel's backlog), never answers
    try:
        run_dir = run_dir_with(tmp_path, trainer=sleeper.pid)
        write_services(run_dir, ray={"gcs_address": f"127.0.0.1:{hung.getsockname()[1]}"})
        start = time.monotonic()
        diagnosis = collect(run_dir, HealthConfig())
        took = time.monotonic() - start
    finally:
        hung.close()
    assert took < 6.0 + 30.0, took  # the Ray deadline, plus the stacks and probes on a busy machine
    assert diagnosis.path.is_file()
    notes = "\n".join(diagnosis.verdict["details"])
    assert "no answer from the Ray cluster" in notes and "in 6 s" in notes, notes
    terminal = capfd.readouterr()
    assert "gcs_client" not in terminal.out + terminal.err


def test_a_folder_that_is_not_a_run_is_refused_and_left_alone(tmp_path, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("hello")
    assert miles(["diagnose", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "is not a run directory" in err and "metrics.jsonl" in err
    assert sorted(p.name for p in folder.iterdir()) == ["readme.txt"]


def test_bundle_paths_that_cannot_be_one_are_refused(tmp_path, capsys):
    run_dir = run_dir_with(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run_dir / "diagnose").symlink_to(elsewhere)
    assert miles(["diagnose", str(run_dir)]) == 2
    assert "is a link or not a folder" in capsys.readouterr().err and list(elsewhere.iterdir()) == []
    (run_dir / "diagnose").unlink()
    assert miles(["diagnose", str(run_dir), "--out", str(elsewhere)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert miles(["diagnose", str(run_dir), "--out", str(tmp_path / "missing" / "x.tar.gz")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "missing").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "run"]  # no DIR.tmp left beside
    assert miles(["diagnose", str(run_dir), "--out", str(elsewhere / "b.tar.gz")]) == 0
    assert [p.name for p in elsewhere.iterdir()] == ["b.tar.gz"]


def test_processes_are_named_by_what_they_run():
    from miles.diagnose.stacks import service_role

    venv = "/w/.venv/bin"
    assert service_role(["python", f"{venv}/miles", "train", "--config", "c.yaml", "--use-mlflow",
                         "--run-dir", "/runs/x"]) == "driver"
    assert service_role(["python", "-m", "flows.cli", "train", "--use-mlflow"]) == "driver"
    assert service_role(["python", f"{venv}/mlflow", "ui", "--backend-store-uri", "sqlite:////runs/x/mlflow.db"]) \
        == "mlflow-ui"
    assert service_role(["python", "-m", "miles.tracking.cli", "/runs/x", "--follow"]) == "delivery"
    assert service_role(["python", "-m", "miles.dashboard.cli", "/runs/x", "--use-mlflow"]) is None


def test_a_cleanly_finished_run_is_finished():
    def verdict(last, closed):
        run = RunState(False, last, 6, closed)
        return compose(Findings(False, [], [], [], {}, run), HealthConfig())

    done = verdict(5, {"final": True})
    assert done["status"] == "finished"
    assert done["headline"] == "finished: all 6 rollouts (0..5), closed cleanly"
    stopped = verdict(3, {"final": True})
    assert stopped["status"] == "stopped" and "after rollout 3 (4 rollouts done of 6)" in stopped["headline"]
    died = verdict(3, None)
    assert died["status"] == "dead" and died["headline"].startswith("the trainer died after rollout 3 (4 rollouts")
