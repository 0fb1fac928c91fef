"""The tiny task a run falls back on (the addition task, or the multi-turn calculator task): its
paths, named without touching the disk, and the step that makes its files once, into the cache."""
from __future__ import annotations

import json
import time
from pathlib import Path

from miles.config.resolve import TaskDefaults


# How long the warm start takes, said the same way wherever a user is told (measured: 75 s to make it on
# an idle 2-core machine, 2026-12-04; the first-hour review found four different figures in four places)
MAKING_TAKES = "about 75 s on an idle 2-core machine, longer when it is busy"

def uses_tool_task(config) -> bool:
    """A custom generate function (multi-turn) falls back on the calculator task, else the addition task."""
    return config.generate.custom_generate_function_path is not None


def uses_moe(config) -> bool:
    """The run falls back on the tiny mixture-of-experts policy (--tiny-policy moe)."""
    return config.rollout.tiny_policy == "moe"


def task_defaults(multi_turn: bool, moe: bool = False) -> TaskDefaults:
    """The cached files of the tiny task (they may not exist yet: `make_task_files` makes
    them); with `moe`, the addition task's mixture-of-experts base model."""
    if multi_turn:
        from miles.tiny.recipes import tool_model_dir as model_dir, tool_task_dir as data_dir
    elif moe:
        from miles.tiny.recipes import moe_base_model_dir as model_dir, task_data_dir as data_dir
    else:
        from miles.tiny.recipes import base_model_dir as model_dir, task_data_dir as data_dir
    data = data_dir()
    return TaskDefaults(model=model_dir(), train_data=data / "train.jsonl", eval_data=data / "eval.jsonl")


def run_task_defaults(config) -> TaskDefaults:
    """`task_defaults` of the run's flags: the multi-turn task, or the addition task's dense or
    MoE model."""
    return task_defaults(uses_tool_task(config), uses_moe(config))


def make_task_data(config) -> None:
    """Write the tiny task's train and eval files if the run uses them (milliseconds; deterministic)."""
    multi_turn = uses_tool_task(config)
    task = task_defaults(multi_turn)
    if config.rollout.prompt_data == str(task.train_data) or str(task.eval_data) in config.rollout.eval_prompt_data:
        if multi_turn:
            from miles.tiny.recipes import tool_task_data as write
        else:
            from miles.tiny.recipes import default_task_data as write
        write()


def tiny_model_missing(config) -> Path | None:
    """The tiny base model's directory when the run uses it and it is not made yet, else None."""
    model = run_task_defaults(config).model
    if config.rollout.hf_checkpoint != str(model) or (model / "warmstart.json").exists():
        return None
    return model


def make_tiny_model(config, progress: bool = True) -> Path | None:
    """Make the tiny base model the run uses if it is missing (a supervised warm start, once per machine,
    MAKING_TAKES), saying so; returns its directory when it was made here."""
    target = tiny_model_missing(config)
    if target is None:
        return None
    if uses_tool_task(config):
        from miles.tiny.tool_warmstart import ensure_tool_model as ensure
    elif uses_moe(config):
        from miles.tiny.warmstart import ensure_moe_base_model as ensure
    else:
        from miles.tiny.warmstart import ensure_base_model as ensure
    print(f"[prepare] making the tiny base model (first run on this machine only, {MAKING_TAKES}): {target}",
          flush=True)
    start = time.time()
    path = ensure(progress=progress)
    report = json.loads((path / "warmstart.json").read_text())
    print(f"[prepare] base model made in {time.time() - start:.0f}s ({report['steps']} supervised steps); "
          f"cached for the next runs", flush=True)
    return path
