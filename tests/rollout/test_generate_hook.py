"""`--custom-generate-function-path` and the tool flags are checked at start-up; a bad one names its flag."""
from __future__ import annotations

import pytest

from miles.config import ConfigError, GenerateConfig
from miles.rollout import generate as single_turn
from miles.rollout import multi_turn
from miles.rollout.generate_hook import load_generate_function

TOOLS = dict(generate_tool_specs_path="miles.tiny.calculator.TOOL_SPECS", generate_tool_call_parser="tiny",
             generate_execute_tool_function_path="miles.tiny.calculator.execute_tool")


def sync_generate(input):
    return input.sample


async def two_args(input, extra):
    return input.sample


async def execute_sync_style(name):
    return ""


def test_default_is_the_single_turn_generator_and_multi_turn_loads_with_its_tools():
    assert load_generate_function(GenerateConfig()) is single_turn.generate
    fn = load_generate_function(GenerateConfig(custom_generate_function_path="miles.rollout.multi_turn.generate",
                                               **TOOLS))
    assert fn is multi_turn.generate


@pytest.mark.parametrize("fields, flag, message", [
    (dict(custom_generate_function_path="no_such_pkg.gen"), "--custom-generate-function-path", "cannot import"),
    (dict(custom_generate_function_path="miles.rollout.multi_turn.nope"), "--custom-generate-function-path",
     "has no function"),
    (dict(custom_generate_function_path=f"{__name__}.sync_generate"), "--custom-generate-function-path", "async"),
    (dict(custom_generate_function_path=f"{__name__}.two_args"), "--custom-generate-function-path",
     "1 positional"),
    (dict(custom_generate_function_path="miles.rollout.multi_turn.generate"), "--generate-tool-specs-path",
     "needs the tool specs"),
    (dict(TOOLS, generate_execute_tool_function_path=f"{__name__}.execute_sync_style"),
     "--generate-execute-tool-function-path", "2 positional"),
    (dict(TOOLS, generate_tool_specs_path="miles.tiny.calculator.evaluate"), "--generate-tool-specs-path",
     "tool spec"),
])
def test_bad_hooks_fail_naming_the_flag(fields, flag, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load_generate_function(GenerateConfig(**fields))
    assert caught.value.flag == flag


def test_the_multi_turn_config_file_parses_and_its_hooks_load():
    from pathlib import Path

    from miles.config import parse_config

    config = parse_config(["--config", str(Path(__file__).parents[2] / "configs" / "tiny-multi-turn.yaml")])
    assert load_generate_function(config.generate) is multi_turn.generate
    assert config.engine.tool_call_parser == config.generate.generate_tool_call_parser == "tiny"
    assert config.rollout.hf_checkpoint is None  # the tiny defaults: the calculator task's model and data
