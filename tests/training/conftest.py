"""Shared parts for training tests: one local Ray, one embedded engine on the tiny base model."""
import os

import pytest
import ray

from miles.config import parse_config
from miles.tiny.warmstart import ensure_base_model

# Small enough to run in seconds on 2 busy cores, big enough for GRPO groups and two ranks.
SMALL = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--num-rollout", "4",
         "--micro-batch-size", "8", "--eval-max-prompts", "8", "--n-samples-per-eval-prompt", "2",
         "--eval-interval", "2", "--lr", "1e-3"]


@pytest.fixture(scope="session")
def base_model():
    return ensure_base_model(progress=False)


@pytest.fixture(scope="session")
def ray_cluster():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, namespace="miles", include_dashboard=False, object_store_memory=128 * 1024 * 1024,
                 log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def engine(base_model, tmp_path_factory):
    from miles.engines.launch import launch_engine

    handle = launch_engine(base_model, device="cpu", log_path=tmp_path_factory.mktemp("engine") / "engine.log",
                           env={"OMP_NUM_THREADS": "1"})
    yield handle
    handle.stop()


@pytest.fixture
def small_config(tmp_path):
    def make(*extra):
        return parse_config([*SMALL, "--run-dir", str(tmp_path / "run"), *extra])
    return make
