"""A row from a Ray worker reaches the terminal as `(train_chunk pid=N) [trainer] iter ...`: Prefect's own
console prefix is off on the workers, and Ray's prefix carries no colour codes off a terminal; a local cluster
starts with token auth but without Ray's lines about it."""
from __future__ import annotations

import os

from miles.cluster.connect import plain_prefixes
from tasks.cluster import TERSE_TASK_LOGS, worker_env


def test_the_workers_task_log_format_is_the_message_alone(monkeypatch):
    from prefect.logging.configuration import DEFAULT_LOGGING_SETTINGS_PATH, load_logging_config

    env = worker_env("http://127.0.0.1:4200/api")
    assert TERSE_TASK_LOGS.items() <= env.items()
    for name, value in TERSE_TASK_LOGS.items():
        monkeypatch.setenv(name, value)
    config = load_logging_config(DEFAULT_LOGGING_SETTINGS_PATH)  # what Prefect does on a worker
    assert config["formatters"]["standard"]["task_run_fmt"] == "%(message)s"


def test_no_colour_codes_off_a_terminal(monkeypatch):
    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    plain_prefixes()
    assert os.environ["RAY_COLOR_PREFIX"] == "0"
    monkeypatch.setenv("RAY_COLOR_PREFIX", "1")  # the user's choice is kept
    plain_prefixes()
    assert os.environ["RAY_COLOR_PREFIX"] == "1"


def test_a_local_cluster_starts_with_token_auth_and_without_rays_lines_about_it(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    # a fresh home: no ~/.ray/auth_token yet, so Ray makes one (and would say so), and RAY_AUTH_MODE unset
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    script = ("import os, ray; from miles.cluster.connect import connect; connect(None, num_cpus=1); "
              "print('mode', os.environ['RAY_AUTH_MODE']); ray.shutdown()")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mode token" in done.stdout and (tmp_path / ".ray" / "auth_token").is_file()  # token auth is on
    output = done.stdout + done.stderr
    assert "Token authentication is enabled" not in output and "Generated new authentication token" not in output
