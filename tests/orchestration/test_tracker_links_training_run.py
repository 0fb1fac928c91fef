"""First-hour N13: the tracker runs' `prefect.flow_run_url` tag links the flow run that trains (the
`...-on-ray` subflow, whose tasks open them), not the parent that only builds the model and the cluster,
although the cluster's workers were started with the parent's URL."""
from __future__ import annotations

import os

from prefect import flow, task

from miles.config import parse_config
from miles.config.run_info import FLOW_RUN_URL_ENV, run_tags
from tasks.training import link_tracker_runs_to_this_flow_run


@task
def chunk_probe() -> str | None:
    return link_tracker_runs_to_this_flow_run()


@flow(name="training-probe")
def training_probe() -> tuple[str, str | None]:
    from prefect.context import get_run_context
    from prefect.utilities.urls import url_for

    return url_for(get_run_context().flow_run), chunk_probe()


@flow(name="parent-probe")
def parent_probe() -> tuple[str, str, str | None]:
    from prefect.context import get_run_context
    from prefect.utilities.urls import url_for

    return (url_for(get_run_context().flow_run), *training_probe())


def test_the_tag_names_the_training_subflow(prefect_api, tmp_path, monkeypatch):
    monkeypatch.setenv(FLOW_RUN_URL_ENV, "http://parent.invalid/runs/flow-run/parent")  # as the workers start
    parent, training, linked = parent_probe()
    assert linked == training and training != parent and "/runs/flow-run/" in training
    assert os.environ[FLOW_RUN_URL_ENV] == training
    tags = run_tags(parse_config(["--run-dir", str(tmp_path / "r")]), tmp_path / "r")
    assert tags["prefect.flow_run_url"] == training


def test_outside_a_flow_run_nothing_changes(monkeypatch):
    monkeypatch.setenv(FLOW_RUN_URL_ENV, "http://x.invalid/runs/flow-run/1")
    assert link_tracker_runs_to_this_flow_run() is None
    assert os.environ[FLOW_RUN_URL_ENV] == "http://x.invalid/runs/flow-run/1"
