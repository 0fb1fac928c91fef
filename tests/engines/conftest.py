"""Shared fixtures of the engine tests: one live engine on loopback, and the real model runner with a
scheduler on it, driven in process (tests/support/in_process_engine.py)."""
from __future__ import annotations

import httpx
import pytest

from miles.config import EngineConfig
from miles.engines.launch import launch_engine
from miles.engines.metrics import EngineMetrics
from miles.engines.model_runner import ModelRunner
from miles.engines.scheduler import Scheduler
from tests.support.engines import MAX_BATCH, MAX_QUEUED


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory):
    """The live engine's log and timeline file."""
    return tmp_path_factory.mktemp("engine")


@pytest.fixture(scope="session")
def engine(base_model, engine_dir):
    config = EngineConfig(engine_device="cpu", engine_max_batch_size=MAX_BATCH, engine_max_queued_requests=MAX_QUEUED)
    handle = launch_engine(base_model, config, log_path=engine_dir / "engine.log",
                           serve_args=["--timeline-path", str(engine_dir / "timeline.jsonl")])
    yield handle
    handle.stop()


@pytest.fixture()
def client(engine):
    with httpx.Client(base_url=engine.url, timeout=120.0) as c:
        yield c


@pytest.fixture(scope="module")
def runner(base_model):
    """The tiny model on the CPU, loaded once per module that asks for it."""
    return ModelRunner(base_model, device="cpu")


@pytest.fixture()
def scheduler(runner):
    s = Scheduler(runner, EngineMetrics(model_name="test"), max_batch_size=8, max_queued=64, weight_version="v1")
    s.start()
    yield s
    s.stop()
