"""`prepare(argv)`: the one start of a run, used by `python -m miles.train`, `miles train` and the flow.

    parse the flags -> resolve every default (paths only, nothing made) -> write the tiny task's
    data if the run uses it (milliseconds) -> preflight (every check that needs no cluster) -> the
    context and parallel layout checks (from the model's files, or the tiny model's shape before
    it is made) -> make the base model if the run uses the tiny one or a catalog one
    (`--hf-checkpoint smollm2-135m-instruct`)
    and it is missing (minutes, once per machine)

A bad flag, hook or data path fails before anything starts. The flow makes the model in a task
of its own instead (`make_model=False` here), so the wait shows in the Prefect UI.
"""
from __future__ import annotations

from miles.config import MilesConfig, parse_config
from miles.config.resolve import resolve
from miles.preflight import check_context, check_parallel_layout, preflight
from miles.pretrained import fallback as pretrained
from miles.tiny import defaults as tiny


def resolve_run(config: MilesConfig) -> MilesConfig:
    """`resolve` with a fallback model and data: a catalog checkpoint's directory and chat task when
    --hf-checkpoint names one, else the tiny task. Pure: makes no file."""
    config, task = pretrained.with_named_checkpoint(config)
    return resolve(config, task or tiny.run_task_defaults(config))


def base_model_missing(config: MilesConfig):
    """The directory of the base model the run must make first (tiny or catalog), or None."""
    return tiny.tiny_model_missing(config) or pretrained.model_missing(config)


def make_base_model(config: MilesConfig) -> None:
    tiny.make_tiny_model(config)
    pretrained.make_model(config)


def prepare_config(config: MilesConfig, make_model: bool = True) -> MilesConfig:
    """`prepare` for flags already parsed."""
    config = resolve_run(config)
    tiny.make_task_data(config)
    pretrained.make_task_data(config)
    preflight(config)
    missing = base_model_missing(config)
    check_context(config)  # the tiny model's shape is known before it is made: a bad flag fails before the wait
    check_parallel_layout(config)
    if make_model and missing is not None:
        make_base_model(config)
        check_context(config)  # from the files just made (a catalog checkpoint's context is only known then)
        check_parallel_layout(config)
    return config


def prepare(argv: list[str] | None, prog: str = "miles train", make_model: bool = True) -> MilesConfig:
    """Parse, resolve, check and (with `make_model`) make what the run needs; the config every part reads."""
    return prepare_config(parse_config(argv, prog=prog), make_model=make_model)
