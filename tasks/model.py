"""The base model (the tiny one, or a catalog checkpoint) as a task of the flow: made once per machine, cached after."""
from __future__ import annotations

from prefect import get_run_logger, task

from miles.config import MilesConfig
from miles.preflight import check_context
from miles.prepare import base_model_missing, make_base_model as make_model


@task(name="make_base_model")
def make_base_model(config: MilesConfig) -> str:
    """The run's model directory, made first when the run uses the tiny or a catalog model and it is missing."""
    if base_model_missing(config) is None:
        get_run_logger().info(f"model {config.rollout.hf_checkpoint} is ready")
    else:
        make_model(config)
        check_context(config)  # a catalog checkpoint's context is known once its files are made (the tiny one's before)
    return config.rollout.hf_checkpoint
