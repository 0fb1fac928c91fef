"""Tool calls: both formats parse and render, and every kind of bad call becomes a counted error observation."""
from __future__ import annotations

import asyncio

import pytest

from miles.rollout.tool_calls import ToolCall, make_parser, run_tool_calls
from miles.tiny.calculator import TOOL_SPECS, evaluate, execute_tool


def run(parsed, parser, execute=execute_tool, timeout=1.0):
    return asyncio.run(run_tool_calls(parsed, parser, execute, timeout))


def test_tiny_format_round_trips_and_fills_the_first_parameter():
    parser = make_parser("tiny", TOOL_SPECS)
    text = parser.render_call(ToolCall("calc", {"expression": "37*58"}))
    assert text == "<tool_call>calc 37*58</tool_call>"
    parsed = parser.parse("let me see " + text)
    assert parsed.content == "let me see " and parsed.calls == [ToolCall("calc", {"expression": "37*58"})]
    assert [r.text for r in run(parsed, parser)] == ["2146"]


def test_qwen25_format_parses_json_calls():
    parser = make_parser("qwen25", TOOL_SPECS)
    text = parser.render_call(ToolCall("calc", {"expression": "2*(3+4)"}))
    parsed = parser.parse(text)
    assert parsed.calls == [ToolCall("calc", {"expression": "2*(3+4)"})] and not parsed.errors
    assert run(parsed, parser)[0].text == "14"


def test_plain_answer_wants_no_tool():
    parsed = make_parser("tiny", TOOL_SPECS).parse("2146")
    assert not parsed.wants_tools and parsed.content == "2146"


@pytest.mark.parametrize("text, error", [
    ("<tool_call>calc 37*5", "no closing"),                 # the turn ended inside the call
    ("<tool_call>{not json}</tool_call>", "not JSON"),     # qwen25 only, below
])
def test_malformed_calls_become_errors(text, error):
    parser = make_parser("qwen25" if "{" in text else "tiny", TOOL_SPECS)
    results = run(parser.parse(text), parser)
    assert len(results) == 1 and results[0].error and error in results[0].text


def test_unknown_tool_raising_tool_and_timeout_are_observations_not_crashes():
    parser = make_parser("tiny", TOOL_SPECS)
    unknown = run(parser.parse("<tool_call>sqrt 9</tool_call>"), parser)[0]
    assert unknown.error and "unknown tool 'sqrt'" in unknown.text
    bad_input = run(parser.parse("<tool_call>calc 37/</tool_call>"), parser)[0]
    assert bad_input.error and bad_input.text.startswith("error: ValueError")

    async def slow(name, arguments):
        await asyncio.sleep(30)
        return "never"
    timed_out = run(parser.parse("<tool_call>calc 1+1</tool_call>"), parser, execute=slow, timeout=0.05)[0]
    assert timed_out.error and "timed out" in timed_out.text


def test_calculator_refuses_anything_but_integer_arithmetic():
    assert evaluate("12*(3-5)") == -24
    for bad in ("__import__('os')", "2**100000", "1.5*2", "9" * 20 + "*" + "9" * 20):
        with pytest.raises(ValueError):
            evaluate(bad)


def test_unknown_parser_is_rejected():
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        make_parser("hermes", TOOL_SPECS)
