"""Fixtures of the security probes: one real embedded engine (with an admin token) and routers in front
of it, all on loopback; a finished run with MLflow and TensorBoard and copies of it for `miles replay-spool`."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from miles.config import EngineConfig
from miles.engines.launch import launch_engine
from tests.support.routers import router_factory
from tests.tracking.tracking_helpers import run_synthetic

from .probes import MAX_BATCH, TOKEN
from .spooled_runs import TRACKERS


@pytest.fixture(scope="session")
def engine(untrained_model, tmp_path_factory):
    """An engine with an admin token: the probes of its endpoints, limits and weight checks (how requests and
    files are refused, not what the model answers: an untrained model)."""
    config = EngineConfig(engine_device="cpu", engine_max_batch_size=MAX_BATCH, engine_header_timeout=2)
    handle = launch_engine(untrained_model, config, log_path=tmp_path_factory.mktemp("engine") / "engine.log",
                           env={"MILES_ENGINE_ADMIN_TOKEN": TOKEN})
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def tiny_engine(untrained_model, tmp_path_factory):
    """An engine without a token and with the `tiny` tool-call parser: the /v1 probes (chat shapes, knobs,
    special tokens), which check how requests are read, not what the model answers: an untrained model."""
    config = EngineConfig(engine_device="cpu", engine_max_batch_size=8, tool_call_parser="tiny")
    handle = launch_engine(untrained_model, config, log_path=tmp_path_factory.mktemp("tiny-engine") / "engine.log")
    yield handle
    handle.stop()


@pytest.fixture
def router(engine):
    """`router(token=TOKEN, **config)`: an in-process router in front of the engine; stopped at teardown."""
    with router_factory() as start_router:
        def start(token: str | None = TOKEN, worker_urls=None, **fields):
            return start_router([engine.url] if worker_urls is None else worker_urls, router_admin_token=token,
                                **fields)
        yield start


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 3-rollout run with MLflow (SQLite) and TensorBoard, every line delivered."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_dir.mkdir()
    run_synthetic(run_dir, "--rollouts", "3", *TRACKERS)
    return run_dir


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A copy whose state files name the copy (the probe's `cp -r` + `sed`), with the MLflow store the runs
    of its folder share (RUN_DIR/../mlflow.db) copied beside it."""
    target = tmp_path / "run"
    shutil.copytree(finished_run, target)
    shutil.copy(finished_run.parent / "mlflow.db", tmp_path / "mlflow.db")
    shutil.copytree(finished_run.parent / "mlartifacts", tmp_path / "mlartifacts")
    for name in ("trainer.json", "delivery.json"):
        path = target / "tracking" / name
        path.write_text(path.read_text().replace(str(finished_run.parent), str(tmp_path)))
    return target
