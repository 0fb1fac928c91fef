"""Probes E3, B4, B5: /v1 fields the embedded engine does not implement were dropped without a word
(`logit_bias`, `top_logprobs`, `response_format`, `tool_choice`, `parallel_tool_calls`, a string
`min_tokens`), and `n` had no bound of its own. Now a value that asks for more than the engine does is
a 400 naming the field; the default values (and leaving them out) still work."""
from __future__ import annotations

import httpx
import pytest

from miles.engines.openai_api import MAX_N

TOOLS = [{"type": "function", "function": {"name": "calc"}}]
CHAT = {"messages": [{"role": "user", "content": "1+1="}], "max_tokens": 2}
COMPLETION = {"prompt": "1+1=", "max_tokens": 2}


def post(engine, path: str, body: dict) -> httpx.Response:
    return httpx.post(engine.url + path, json=body, timeout=120)


REFUSED = [
    ("logit_bias", {"logit_bias": {"5": 100}}),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 3}),
    ("response_format", {"response_format": {"type": "json_object"}}),
    ("tool_choice", {"tools": TOOLS, "tool_choice": "required"}),
    ("tool_choice", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "calc"}}}),
    ("tool_choice", {"tools": TOOLS, "tool_choice": "none"}),
    ("parallel_tool_calls", {"tools": TOOLS, "parallel_tool_calls": "yes"}),
    ("parallel_tool_calls", {"tools": TOOLS, "parallel_tool_calls": False}),
    ("min_tokens", {"min_tokens": "5"}),
    ("min_tokens", {"min_tokens": -1}),
    ("n", {"n": MAX_N + 1}),
]


@pytest.mark.parametrize("param,extra", REFUSED, ids=[f"{p}={e.get(p)!r}" for p, e in REFUSED])
def test_an_unsupported_chat_knob_is_a_400_naming_it(tiny_engine, param, extra):
    answer = post(tiny_engine, "/v1/chat/completions", {**CHAT, **extra})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


@pytest.mark.parametrize("extra,param", [({"logit_bias": {"5": 100}}, "logit_bias"), ({"echo": True}, "echo"),
                                         ({"best_of": 3}, "best_of"), ({"suffix": "x"}, "suffix"),
                                         ({"n": 100_000}, "n")])
def test_an_unsupported_completion_knob_is_a_400_naming_it(tiny_engine, extra, param):
    answer = post(tiny_engine, "/v1/completions", {**COMPLETION, **extra})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


def test_default_values_are_accepted(tiny_engine):
    defaults = {"logit_bias": {}, "top_logprobs": 0, "response_format": {"type": "text"}, "tool_choice": "auto",
                "parallel_tool_calls": True, "min_tokens": 1, "n": 2}
    assert post(tiny_engine, "/v1/chat/completions", {**CHAT, **defaults, "tools": TOOLS}).status_code == 200
    assert post(tiny_engine, "/v1/chat/completions", {**CHAT, "tool_choice": "none"}).status_code == 200  # no tools
    answer = post(tiny_engine, "/v1/completions", {**COMPLETION, "echo": False, "best_of": 1, "n": MAX_N})
    assert answer.status_code == 200 and len(answer.json()["choices"]) == MAX_N, answer.text
