"""Which function finishes each sample: `--custom-generate-function-path`, checked at start-up."""
from __future__ import annotations

from typing import Callable

from miles.rollout.generate import generate
from miles.rollout.multi_turn import load_tool_setup
from miles.rollout.plugins import load_function

FLAG = "--custom-generate-function-path"


def uses_tools(generate_config) -> bool:
    g = generate_config
    return g.custom_generate_function_path == "miles.rollout.multi_turn.generate" or bool(
        g.generate_tool_specs_path or g.generate_execute_tool_function_path)


def load_generate_function(generate_config) -> Callable:
    """The custom generate function (importable, `async def`, one argument: a GenerateFnInput), else the
    single-turn one; with the multi-turn generator or any tool flag, the tools load too, so a bad tool
    flag fails here rather than in the first rollout."""
    path = generate_config.custom_generate_function_path
    fn = load_function(path, FLAG, 1, is_async=True) if path else generate
    if uses_tools(generate_config):
        load_tool_setup(generate_config)
    return fn
