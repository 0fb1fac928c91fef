"""S3: the services and workers a run starts inherit no secret-named variable they do not need.

Each test puts secrets under names the old deny-list did not know (MY_SERVICE_TOKEN, cloud and
MLflow credentials) in the environment, starts the real child, and reads /proc/<pid>/environ.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from miles.config import EngineConfig, RouterConfig
from miles.config.secrets import child_env

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {"MY_SERVICE_TOKEN": "probe-s3-service-token", "AWS_SECRET_ACCESS_KEY": "probe-s3-aws-secret",
           "MLFLOW_TRACKING_PASSWORD": "probe-s3-mlflow-pass", "WANDB_API_KEY": "probe-s3-wandb-key",
           "db_password": "probe-s3-lower-case",
           "DB_URL": "postgres://u:probe-n41-url-pass@db.example/db"}  # N41: a credential inside a URL value
HUB = {"HF_TOKEN": "probe-s3-hub-token"}  # kept on purpose: an engine may load a gated model by its Hub id


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0") if "=" in item)


def assert_no_secret(env: dict[str, str], allowed: dict[str, str] = {}) -> None:
    leaked = sorted(k for k, v in env.items() if v in SECRETS.values())
    assert leaked == [], f"secrets inherited: {leaked}"
    for name, value in allowed.items():
        assert env.get(name) == value


def test_name_rule():
    env = {"PATH": "/bin", "TOKENIZERS_PARALLELISM": "false", "MY_SERVICE_TOKEN": "x", "API_KEY": "x",
           "client_secret": "x", "PGPASSWORD": "x", "HF_TOKEN": "x"}
    assert child_env(env) == {"PATH": "/bin", "TOKENIZERS_PARALLELISM": "false"}
    assert child_env(env, frozenset({"HF_TOKEN"}))["HF_TOKEN"] == "x"


def test_url_rule():
    """N41: a URL-valued variable carrying credentials is not inherited, whatever its name; one without is."""
    env = {"DB_URL": "postgres://u:s3cret@db.example/db", "MLFLOW_TRACKING_URI": "https://alice:pw%40x@mlflow.example",
           "WANDB_BASE_URL": "https://tok123@wandb.example", "PLAIN_URL": "https://mlflow.example/x@y",
           "HTTP_PROXY": "http://proxy.example:3128"}
    assert child_env(env) == {"PLAIN_URL": "https://mlflow.example/x@y", "HTTP_PROXY": "http://proxy.example:3128"}
    assert child_env(env, frozenset({"DB_URL"}))["DB_URL"] == env["DB_URL"]
    from miles.serving.process import SERVICE_KEEP_ENV  # an engine reaches the Hub through the machine's proxy

    assert "HTTPS_PROXY" in child_env({"HTTPS_PROXY": "http://u:p@proxy:3128"}, SERVICE_KEEP_ENV)


def test_url_credentials_are_blanked_in_what_a_run_writes(monkeypatch):
    """N41: the scrubber blanks a URL's credentials (also URL-decoded) from env vars and config values."""
    from miles.config import parse_config
    from miles.config.secrets import env_scrubber, scrubber_for

    monkeypatch.setenv("DB_URL", "postgres://u:s3cret-db@db.example/db")
    monkeypatch.setenv("WANDB_BASE_URL", "https://alice:pw%40wandb@wandb.example")
    scrub = env_scrubber().scrub
    assert scrub("connect postgres://u:s3cret-db@db.example/db failed") == "connect postgres://***@db.example/db failed"
    assert "pw@wandb" not in scrub("password pw@wandb") and "pw%40wandb" not in scrub("https://alice:pw%40wandb@w")
    config = parse_config(["--use-mlflow", "--mlflow-tracking-uri", "https://bob:cfg-pass@mlflow.example"])
    assert scrubber_for(config).scrub("uri https://bob:cfg-pass@mlflow.example") == "uri https://***@mlflow.example"


@pytest.mark.slow
def test_engine_and_router_processes(untrained_model, tmp_path, monkeypatch):
    from miles.engines.launch import launch_engine
    from miles.router.launch import launch_router

    for name, value in {**SECRETS, **HUB}.items():
        monkeypatch.setenv(name, value)
    engine = launch_engine(untrained_model, EngineConfig(engine_device="cpu"), log_path=tmp_path / "engine.log")
    try:
        router = launch_router(RouterConfig(router_admin_token="probe-s3-router-own"), worker_urls=[engine.url],
                               log_path=tmp_path / "router.log")
        try:
            assert_no_secret(environ_of(engine.pid), HUB)
            router_env = environ_of(router.pid)
            assert_no_secret(router_env)
            assert router_env["MILES_ROUTER_ADMIN_TOKEN"] == "probe-s3-router-own"  # its own, handed over
        finally:
            router.stop()
    finally:
        engine.stop()


@pytest.mark.slow
def test_mlflow_ui_process(tmp_path, monkeypatch):
    from miles.mlflow_ui.launch import start_ui

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    ui = start_ui(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path)
    try:
        assert_no_secret(environ_of(ui.pid))
    finally:
        os.killpg(ui.pid, signal.SIGTERM)  # its own session: the server and its workers


@pytest.mark.slow
def test_prefect_server_process(tmp_path, monkeypatch):
    from flows.prefect_server import start_server

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    server = start_server(tmp_path / "prefect-home", port=None, timeout=180.0, ui=False)
    try:
        assert_no_secret(environ_of(server.pid))
    finally:
        server.stop()


RAY_PROBE = """
import json, os, sys
import ray
from miles.cluster.connect import connect
keep = frozenset(json.loads(sys.argv[1]))
connect(None, num_cpus=1, object_store_mb=80, log_to_driver=False, keep_env=keep)
try:
    node = ray._private.worker._global_node
    pids = {kind: [info.process.pid for info in infos] for kind, infos in node.all_processes.items()}
    worker = ray.get(ray.remote(lambda: (os.getpid(), dict(os.environ))).remote())
    print(json.dumps({"services": pids, "worker": worker[1], "driver_kept": os.environ.get("MY_SERVICE_TOKEN")}))
    sys.stdout.flush()
    input()  # the test reads the services' environments while the cluster is up
finally:
    ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("keep", [[], ["WANDB_API_KEY"]], ids=["plain-run", "flow-keeps-tracker-key"])
def test_local_ray_processes(keep):
    env = {**os.environ, **SECRETS}
    probe = subprocess.Popen([sys.executable, "-c", RAY_PROBE, json.dumps(keep)], cwd=ROOT, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        report = json.loads(probe.stdout.readline())
        assert report["driver_kept"] == SECRETS["MY_SERVICE_TOKEN"]  # the driver's own environment is restored
        kept = {k: SECRETS[k] for k in keep}
        worker = {k: v for k, v in report["worker"].items() if k not in kept}
        assert_no_secret(worker)
        assert {k: report["worker"].get(k) for k in kept} == kept
        pids = [pid for kind in ("gcs_server", "raylet") for pid in report["services"].get(kind, [])]
        assert pids, report["services"]
        for pid in pids:
            assert_no_secret({k: v for k, v in environ_of(pid).items() if k not in kept})
    finally:
        probe.communicate("\n", timeout=120)
