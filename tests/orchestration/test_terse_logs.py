"""A row from a Ray worker reaches the terminal as `(train_chunk pid=N) [trainer] iter ...`: Prefect's own
console prefix is off on the workers, and Ray's prefix carries no colour codes off a terminal."""
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
