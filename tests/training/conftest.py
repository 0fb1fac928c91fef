"""Shared parts for training tests: one embedded engine on the tiny base model, a small config."""
import pytest

from miles.config import EngineConfig, parse_config

# Small enough to run in seconds on 2 busy cores, big enough for GRPO groups and two ranks.
SMALL = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--num-rollout", "4",
         "--micro-batch-size", "8", "--eval-max-prompts", "8", "--n-samples-per-eval-prompt", "2",
         "--eval-interval", "2", "--lr", "1e-3"]


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
