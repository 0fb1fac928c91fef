"""Probe B1: malformed `tools`, `tool_calls`, content parts and `stream_options` on /v1/chat/completions
are a 400 naming the field, never a bare 500 (N44: so is a role other than system, user, assistant, tool);
a malformed tool spec is refused when the request arrives,
not when the model later calls that tool."""
from __future__ import annotations

import httpx
import pytest

from miles.engines.openai_tools import request_parser, tool_message
from miles.engines.sglang_request import RequestError

TOOLS = [{"type": "function", "function": {"name": "calc"}}]
USER = {"role": "user", "content": "1"}


def assistant(tool_calls) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": tool_calls}


CASES = [
    ("stop 5 with tools", {"messages": [USER], "tools": TOOLS, "stop": 5}, "stop"),
    ("stop object with tools", {"messages": [USER], "tools": TOOLS, "stop": {"a": 1}}, "stop"),
    ("tool_calls 5", {"messages": [USER, assistant(5)], "tools": TOOLS}, "messages"),
    ("tool_calls true", {"messages": [USER, assistant(True)], "tools": TOOLS}, "messages"),
    ("function a string", {"messages": [USER, assistant([{"function": "calc"}])], "tools": TOOLS}, "messages"),
    ("function a list", {"messages": [USER, assistant([{"function": [1]}])], "tools": TOOLS}, "messages"),
    ("call a number", {"messages": [USER, assistant([7])], "tools": TOOLS}, "messages"),
    ("name an int", {"messages": [USER, assistant([{"function": {"name": 5}}])], "tools": TOOLS}, "messages"),
    ("arguments a list", {"messages": [USER, assistant([{"function": {"name": "calc", "arguments": [1, 2]}}])],
                          "tools": TOOLS}, "messages"),
    ("arguments not JSON", {"messages": [USER, assistant([{"function": {"name": "calc", "arguments": "{"}}])],
                            "tools": TOOLS}, "messages"),
    ("text part an int", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages"),
    ("text part null", {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, "messages"),
    ("part a string", {"messages": [{"role": "user", "content": ["hi"]}]}, "messages"),
    ("role bogus (N44)", {"messages": [{"role": "bogus", "content": "hi"}]}, "messages"),
    ("role empty (N44)", {"messages": [USER, {"role": "", "content": "hi"}]}, "messages"),
    ("role upper case (N44)", {"messages": [{"role": "USER", "content": "hi"}]}, "messages"),
    ("stream_options a string", {"messages": [USER], "stream": True, "stream_options": "x"}, "stream_options"),
    ("stream_options a list", {"messages": [USER], "stream": True, "stream_options": [1]}, "stream_options"),
    ("parameters a string", {"messages": [USER], "tools": [
        {"type": "function", "function": {"name": "calc", "parameters": "x"}}]}, "tools"),
    ("required an int", {"messages": [USER], "tools": [
        {"type": "function", "function": {"name": "calc", "parameters": {"required": 5}}}]}, "tools"),
    ("properties a list", {"messages": [USER], "tools": [
        {"type": "function", "function": {"name": "calc", "parameters": {"properties": [1]}}}]}, "tools"),
]


@pytest.mark.parametrize("body,param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_chat_shapes_are_400_naming_the_field(tiny_engine, body, param):
    answer = httpx.post(tiny_engine.url + "/v1/chat/completions", json={"max_tokens": 2, **body}, timeout=120)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["message"]


def test_well_formed_tool_history_still_works(tiny_engine):
    body = {"max_tokens": 2, "tools": TOOLS, "messages": [
        USER, assistant([{"type": "function", "function": {"name": "calc", "arguments": '{"expression": "1"}'}}]),
        {"role": "tool", "content": "1"}, {"role": "user", "content": [{"type": "text", "text": "again"},
                                                                         {"type": "image_url", "image_url": {}}]}]}
    answer = httpx.post(tiny_engine.url + "/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("parameters", ["x", {"required": 5}, {"required": [1]}, {"properties": "p"}])
def test_a_malformed_tool_spec_is_refused_before_the_model_calls_it(parameters):
    tools = [{"type": "function", "function": {"name": "calc", "parameters": parameters}}]
    with pytest.raises(RequestError) as refused:
        request_parser({"tools": tools}, "tiny")
    assert refused.value.param == "tools" and "calc" in refused.value.message


def test_a_well_formed_spec_parses_the_models_call():
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
    message, finish = tool_message("<tool_call>calc 1+1</tool_call>", request_parser({"tools": tools}, "tiny"))
    assert finish == "tool_calls" and message["tool_calls"][0]["function"]["arguments"] == '{"expression": "1+1"}'
