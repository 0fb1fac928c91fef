"""The tiny base model as a task of the flow: made once per machine (1-3 min on 2 cores), cached after."""
from __future__ import annotations

from prefect import get_run_logger, task

from miles.config import MilesConfig
from miles.tiny.defaults import make_tiny_model, tiny_model_missing


@task(name="make_base_model")
def make_base_model(config: MilesConfig) -> str:
    """The run's model directory, made first when the run uses the tiny model and it is missing."""
    if tiny_model_missing(config) is None:
        get_run_logger().info(f"model {config.rollout.hf_checkpoint} is ready")
    else:
        make_tiny_model(config)
    return config.rollout.hf_checkpoint
