"""Shared parts for training tests: one embedded engine on the tiny base model, a small config."""
import pytest

from miles.config import EngineConfig, parse_config
from tests.support.flags import SMALL



@pytest.fixture(scope="session")
def engine(base_model, tmp_path_factory):
    from miles.engines.launch import launch_engine

    handle = launch_engine(base_model, EngineConfig(engine_device="cpu"), log_path=tmp_path_factory.mktemp("engine") / "engine.log",
                           env={"OMP_NUM_THREADS": "1"})
    yield handle
    handle.stop()


@pytest.fixture
def small_config(tmp_path):
    def make(*extra):
        return parse_config([*SMALL, "--run-dir", str(tmp_path / "run"), *extra])
    return make
