"""`prepare(argv)`: the one start of a run, used by `python -m miles.train`, `miles train` and the flow.

    parse the flags -> resolve every default (paths only, nothing made) -> write the tiny task's
    data if the run uses it (milliseconds) -> preflight (every check that needs no cluster) ->
    make the tiny base model if the run uses it and it is missing (minutes, once per machine)

A bad flag, hook or data path fails before anything starts. The flow makes the model in a task
of its own instead (`make_model=False` here), so the wait shows in the Prefect UI.
"""
from __future__ import annotations

from miles.config import MilesConfig, parse_config
from miles.config.resolve import resolve
from miles.preflight import check_context, preflight
from miles.tiny.defaults import make_task_data, make_tiny_model, task_defaults, uses_tool_task


def resolve_run(config: MilesConfig) -> MilesConfig:
    """`resolve` with the tiny task as the fallback model and data: pure, makes no file."""
    return resolve(config, task_defaults(uses_tool_task(config)))


def prepare_config(config: MilesConfig, make_model: bool = True) -> MilesConfig:
    """`prepare` for flags already parsed."""
    config = resolve_run(config)
    make_task_data(config)
    preflight(config)
    if make_model:
        make_tiny_model(config)
    check_context(config)  # once the model's files are there
    return config


def prepare(argv: list[str] | None, prog: str = "miles train", make_model: bool = True) -> MilesConfig:
    """Parse, resolve, check and (with `make_model`) make what the run needs; the config every part reads."""
    return prepare_config(parse_config(argv, prog=prog), make_model=make_model)
