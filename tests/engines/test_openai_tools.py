"""OpenAI `tools` helpers of the chat endpoint: parser choice, rendering history, answers with tool_calls."""
from __future__ import annotations

import json

import pytest

from miles.engines.openai_tools import assistant_text, request_parser, stop_at_call_end, tool_message
from miles.engines.sglang_request import RequestError
from miles.tiny.calculator import TOOL_SPECS


def test_no_tools_no_parser_and_tools_need_an_engine_parser():
    assert request_parser({"messages": []}, None) is None
    with pytest.raises(RequestError, match="--tool-call-parser"):
        request_parser({"tools": TOOL_SPECS}, None)
    with pytest.raises(RequestError, match="tool spec"):
        request_parser({"tools": [{"type": "function"}]}, "tiny")


def test_answer_with_a_call_becomes_tool_calls_and_history_renders_back():
    parser = request_parser({"tools": TOOL_SPECS}, "tiny")
    message, finish = tool_message("<tool_call>calc 37*58</tool_call>", parser)
    assert finish == "tool_calls" and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "calc"
    assert json.loads(call["function"]["arguments"]) == {"expression": "37*58"}
    assert assistant_text(message, "", parser) == "<tool_call>calc 37*58</tool_call>"
    assert tool_message("2146", parser) == ({"role": "assistant", "content": "2146"}, None)


def test_a_turn_stops_at_the_end_of_a_call_and_keeps_it():
    sampling = {"stop": "\n"}
    stop_at_call_end(sampling)
    assert sampling == {"stop": ["\n", "</tool_call>"], "no_stop_trim": True}
