"""The processes a run starts wait passively in OpenMP (their torch threads sleep instead of spinning when they
share cores), unless the user chose a policy: services from `service_env`, Ray workers from `connect`'s
runtime env (benchmarks/omp_wait.py measures why)."""
from __future__ import annotations

import json

from miles.cluster.connect import with_worker_env, without_job_env_vars
from miles.serving.process import OMP_WAIT_POLICY_ENV, passive_omp, service_env


def test_a_service_waits_passively_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv(OMP_WAIT_POLICY_ENV, raising=False)
    assert passive_omp({}) == {OMP_WAIT_POLICY_ENV: "PASSIVE"}
    assert service_env(None)[OMP_WAIT_POLICY_ENV] == "PASSIVE"
    monkeypatch.setenv(OMP_WAIT_POLICY_ENV, "ACTIVE")
    assert passive_omp({OMP_WAIT_POLICY_ENV: "ACTIVE"}) == {}
    assert service_env(None)[OMP_WAIT_POLICY_ENV] == "ACTIVE"  # the user's choice stands
    assert service_env({OMP_WAIT_POLICY_ENV: "PASSIVE"})[OMP_WAIT_POLICY_ENV] == "PASSIVE"  # a launcher's too


def test_a_drivers_ray_workers_wait_passively_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv(OMP_WAIT_POLICY_ENV, raising=False)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert with_worker_env(None) == {"env_vars": {OMP_WAIT_POLICY_ENV: "PASSIVE"}}
    flow = {"env_vars": {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}, "working_dir": "."}
    assert with_worker_env(flow) == {"env_vars": {OMP_WAIT_POLICY_ENV: "PASSIVE",
                                                  "PREFECT_API_URL": "http://127.0.0.1:4200/api"}, "working_dir": "."}
    assert flow == {"env_vars": {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}, "working_dir": "."}  # not changed
    # a job whose own runtime env sets the policy: that one reaches the workers, and Ray is not told twice
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"env_vars": {OMP_WAIT_POLICY_ENV: "ACTIVE"}}}))
    assert without_job_env_vars(with_worker_env(None)) == {"env_vars": {}}
    monkeypatch.setenv(OMP_WAIT_POLICY_ENV, "ACTIVE")
    assert with_worker_env(None) is None and with_worker_env(flow) is flow
