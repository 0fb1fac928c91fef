"""Cluster bring-up on real Ray, and the one-API guarantee: tasks run in Ray workers report
to the flow's Prefect server (read back with the Prefect client)."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import ray
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.context import get_run_context
from prefect_ray import RayTaskRunner
from prefect_ray.context import remote_options

from miles.config import ConfigError, OrchestrationConfig
from miles.cluster.connect import check_reachable
from tasks.cluster import bring_up_cluster, shut_down_cluster
from tasks.options import with_run_retries


@task(name="report_worker")
def report_worker(marker: str) -> dict:
    """Raises on its first run (marker file absent), then reports where it ran."""
    path = Path(marker)
    if not path.exists():
        path.write_text("failed once")
        raise RuntimeError("first attempt fails on purpose")
    return {"pid": os.getpid(), "api": os.environ.get("PREFECT_API_URL")}


@flow(name="on-ray", task_runner=RayTaskRunner())
def on_ray(marker: str, orchestration: OrchestrationConfig) -> dict:
    with remote_options(max_retries=0):
        return with_run_retries(report_worker, orchestration).submit(marker).result()


@flow(name="cluster-check")
def cluster_check(marker: str, api_url: str) -> dict:
    orchestration = OrchestrationConfig(ray_num_cpus=2, task_retries=1, task_retry_delay=0.0)
    cluster = bring_up_cluster(orchestration, api_url)
    try:
        out = on_ray(marker, orchestration)
        out["flow_run_id"] = str(get_run_context().flow_run.id)
        out["resources"] = cluster.resources
        out["started_here"] = cluster.started_here
        return out
    finally:
        shut_down_cluster()


async def _task_runs(flow_run_ids: list) -> list:
    async with get_client() as client:
        subflows = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id={"any_": flow_run_ids}))
        ids = flow_run_ids + [r.id for r in subflows]
        return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))


def test_ray_worker_tasks_report_to_the_flows_server_and_retry(prefect_api, tmp_path):
    import asyncio
    import uuid

    out = cluster_check(str(tmp_path / "marker"), prefect_api.api_url)
    assert out["started_here"] and out["resources"]["CPU"] == 2
    assert out["pid"] != os.getpid(), "the task must run in a Ray worker, not the flow process"
    assert out["api"] == prefect_api.api_url
    assert not ray.is_initialized(), "the flow shuts down the Ray it started"
    runs = asyncio.run(_task_runs([uuid.UUID(out["flow_run_id"])]))
    by_name = {r.name.rsplit("-", 1)[0]: r for r in runs}
    # the subflow shows as a task run of its parent too
    assert set(by_name) == {"bring_up_cluster", "on-ray", "report_worker"}
    worker_run = by_name["report_worker"]
    # one task run, two attempts: Prefect's retry, recorded by the server the flow uses
    assert worker_run.state.is_completed() and worker_run.run_count == 2


def test_unreachable_ray_address_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: nothing answers there
    with pytest.raises(ConfigError, match=f"--ray-address: cannot reach a Ray cluster at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}", timeout=2.0)
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        check_reachable("nowhere")


def test_inside_a_ray_job_the_jobs_cluster_and_env_vars_are_used(monkeypatch):
    import json

    from miles.cluster.connect import existing_cluster_address, without_job_env_vars

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert existing_cluster_address(None) is None and existing_cluster_address("10.0.0.1:6379") == "10.0.0.1:6379"
    ours = {"env_vars": {"PREFECT_API_URL": "http://127.0.0.1:4200/api", "MILES_CACHE_DIR": "/c"}}
    assert without_job_env_vars(ours) == ours  # not a job: nothing to leave out
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")  # what Ray sets for a job's driver
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(
        {"runtime_env": {"env_vars": {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}}}))
    assert existing_cluster_address(None) == "10.0.0.2:6379"
    assert existing_cluster_address("10.0.0.1:6379") == "10.0.0.1:6379"  # the flag wins
    # Ray refuses a driver that sets a variable the job's runtime env already sets
    assert without_job_env_vars(ours) == {"env_vars": {"MILES_CACHE_DIR": "/c"}}
