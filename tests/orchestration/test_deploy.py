"""Deployments from prefect.yaml on the session's server, and one run end to end through a worker."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.deploy import POOL, PROJECT_DIR, apply_deployments, ensure_pool
from tests.support.flags import FLOW

PREFECT = str(Path(sys.executable).with_name("prefect"))


@pytest.fixture(scope="module")
def deployed(prefect_api):
    ensure_pool()
    assert ensure_pool() is False  # the second call finds it
    apply_deployments(prefect_api.api_url)
    return prefect_api


def test_manual_and_scheduled_deployments_exist_on_the_process_pool(deployed):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        manual = client.read_deployment_by_name("grpo/tiny-cpu")
        nightly = client.read_deployment_by_name("grpo/tiny-cpu-nightly")
        multi_turn = client.read_deployment_by_name("grpo/tiny-multi-turn")
        assert client.read_work_pool(POOL).type == "process"
    assert manual.work_pool_name == nightly.work_pool_name == POOL
    assert manual.parameters["config_file"] == "deployments/tiny-cpu.yaml" and not manual.schedules
    assert [s.schedule.cron for s in nightly.schedules] == ["0 3 * * *"]
    assert multi_turn.parameters["config_file"] == "configs/tiny-multi-turn.yaml"
    assert multi_turn.work_pool_name == POOL


@pytest.mark.slow
def test_a_deployment_run_completes_through_a_worker(deployed, tmp_path):
    env = dict(os.environ, PREFECT_API_URL=deployed.api_url)
    flags = json.dumps([*FLOW, "--run-dir", str(tmp_path / "run"), "--num-rollout", "2"])
    subprocess.run([PREFECT, "deployment", "run", "grpo/tiny-cpu", "--param", f"flags={flags}"],
                   env=env, cwd=PROJECT_DIR, check=True, capture_output=True, timeout=120)
    worker = subprocess.run([PREFECT, "worker", "start", "--pool", POOL, "--run-once"], env=env, cwd=PROJECT_DIR,
                            capture_output=True, text=True, timeout=900)
    assert worker.returncode == 0, worker.stdout[-3000:] + worker.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.jsonl").is_file(), worker.stdout[-3000:] + worker.stderr[-3000:]
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
