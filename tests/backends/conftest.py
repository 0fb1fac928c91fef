"""Shared parts for backend tests: one local Ray for the module's actors, the tiny base model."""
import pytest
import ray

from miles.tiny.warmstart import ensure_base_model


@pytest.fixture(scope="session")
def base_model():
    return ensure_base_model(progress=False)


@pytest.fixture(scope="module")
def ray_cluster():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, namespace="miles", include_dashboard=False, object_store_memory=128 * 1024 * 1024,
                 log_to_driver=False)
    yield
    if started:
        ray.shutdown()
