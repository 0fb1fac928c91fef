"""The official `openai` client against the embedded engine's /v1 routes."""
from __future__ import annotations

import openai
import pytest


@pytest.fixture(scope="module")
def oai(engine):
    with openai.OpenAI(base_url=engine.url + "/v1", api_key="unused-by-the-engine", timeout=120) as c:
        yield c


def test_models_lists_the_served_checkpoint(oai, base_model):
    assert [m.id for m in oai.models.list().data] == [str(base_model)]


def test_chat_completion(oai, base_model):
    out = oai.chat.completions.create(model=str(base_model), messages=[{"role": "user", "content": "12+30="}],
                                      max_tokens=6, temperature=0, logprobs=True)
    choice = out.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert out.usage.completion_tokens == len(choice.logprobs.content) > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert all(item.logprob <= 0 for item in choice.logprobs.content)


def test_chat_stream_reassembles_the_plain_answer(oai, base_model):
    request = dict(model=str(base_model), messages=[{"role": "user", "content": "45+21="}], max_tokens=6,
                   temperature=0)
    plain = oai.chat.completions.create(**request).choices[0].message.content
    chunks = list(oai.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == plain
    assert finishes in (["stop"], ["length"])
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completions_plain_n_and_stream(oai, base_model, client):
    native = client.post("/generate", json={"text": "37+58=", "sampling_params": {"temperature": 0,
                                                                                 "max_new_tokens": 4}}).json()
    out = oai.completions.create(model=str(base_model), prompt="37+58=", max_tokens=4, temperature=0, logprobs=1)
    assert out.choices[0].text == native["text"]  # greedy: the same answer through both APIs
    assert len(out.choices[0].logprobs.token_logprobs) == out.usage.completion_tokens
    many = oai.completions.create(model=str(base_model), prompt="3+4=", max_tokens=3, n=3, temperature=1.0)
    assert len(many.choices) == 3 and many.usage.prompt_tokens == 4
    streamed = oai.completions.create(model=str(base_model), prompt="37+58=", max_tokens=4, temperature=0,
                                      stream=True)
    assert "".join(c.choices[0].text for c in streamed) == native["text"]


def test_bad_request_is_a_clean_openai_error(oai, base_model):
    with pytest.raises(openai.BadRequestError, match="messages"):
        oai.chat.completions.create(model=str(base_model), messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        oai.completions.create(model=str(base_model), prompt="1+1=", max_tokens=-3)
