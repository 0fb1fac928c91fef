"""Shared fixtures of the engine tests: the tiny base checkpoint and one live engine on loopback."""
from __future__ import annotations

import httpx
import pytest

from miles.config import EngineConfig
from miles.engines.launch import launch_engine
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
