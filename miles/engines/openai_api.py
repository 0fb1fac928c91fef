"""OpenAI-compatible routes of the embedded engine: /v1/models, /v1/completions, /v1/chat/completions.

Requests map onto the same sampling params and scheduler path as SGLang's /generate;
chat prompts come from the tokenizer's chat template. Streaming uses server-sent events
(`data: {...}` chunks, then `data: [DONE]`), as the official `openai` client expects.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from miles.engines.chat_prompt import render_chat
from miles.engines.detokenize import IncrementalText, final_text
from miles.engines.http import read_json, sse
from miles.engines.openai_tools import assistant_text, request_parser, stop_at_call_end, tool_message
from miles.engines.sglang_request import (DEFAULT_MAX_NEW_TOKENS, GenerationResult, RequestError, SamplingParams,
                                    parse_sampling_params)
from miles.engines.scheduler import TokenEvent

if TYPE_CHECKING:
    from fastapi import FastAPI

    from miles.engines.frontend import EngineFrontend

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
# OpenAI request fields that map one-to-one onto SGLang sampling params.
PASSTHROUGH = ("temperature", "top_p", "top_k", "stop", "seed", "ignore_eos", "stop_token_ids",
               "frequency_penalty", "presence_penalty", "repetition_penalty", "min_p", "skip_special_tokens",
               "no_stop_trim", "logit_bias")
# OpenAI fields this engine does not implement, with the values that ask for nothing beyond what it does
# (absent or null always pass); any other value is a 400 naming the field, so that no client believes
# it was honoured. tool_choice "none" is honoured only without tools (with them, calls are still parsed).
DEFAULT_ONLY = {"top_logprobs": (0,), "response_format": ({"type": "text"},), "tool_choice": ("auto",),
                "parallel_tool_calls": (True,), "echo": (False,), "best_of": (1,), "suffix": ("",)}
CHAT_ROLES = ("system", "user", "assistant", "tool")  # the roles the chat templates render
MAX_N = 128  # choices of one request: more would hold a share of the queue and batch for one client


@dataclass(frozen=True)
class OpenAICall:
    prompts: list[list[int]]
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    logprobs: bool
    model: str


def add_openai_routes(app: "FastAPI", frontend: "EngineFrontend", tool_call_parser: str | None) -> None:
    api = OpenAIRoutes(frontend, tool_call_parser)
    app.get("/v1/models")(api.models)
    app.post("/v1/completions")(api.completions)
    app.post("/v1/chat/completions")(api.chat_completions)


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def _text_parts(parts: list, index: int) -> str:
    """The text of a message's OpenAI content parts (other part types carry nothing this engine reads)."""
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise RequestError(f"messages[{index}].content[{j}] must be an object like {{\"type\": \"text\", "
                               f"\"text\": ...}}", param="messages")
        if part.get("type") == "text":
            if not isinstance(part.get("text"), str):
                raise RequestError(f"messages[{index}].content[{j}].text must be a string", param="messages")
            texts.append(part["text"])
    return "".join(texts)


def _int_field(body: dict, name: str, default: int | None, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RequestError(f"{name} must be an integer >= {minimum}, got {value!r}", param=name)
    return value


class OpenAIRoutes:
    def __init__(self, frontend: "EngineFrontend", tool_call_parser: str | None):
        self.frontend, self.tool_call_parser = frontend, tool_call_parser

    @property
    def model_name(self) -> str:
        return self.frontend.runner.model_path

    async def models(self):
        return {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                            "created": int(self.frontend.started_at), "owned_by": "miles"}]}

    # ---- parsing --------------------------------------------------------------------------------------
    def _call(self, body: dict, prompts: list[list[int]], default_max: int | None,
              tool_calls: bool = False) -> OpenAICall:
        """The call a /v1 body asks for, checked; run off the event loop (`off_loop`): the body's lists
        (stop strings, stop token ids) are walked here."""
        sampling = {k: body[k] for k in PASSTHROUGH if k in body}
        if tool_calls:
            stop_at_call_end(sampling)
        longest = max(len(p) for p in prompts)
        fallback = default_max or min(DEFAULT_MAX_NEW_TOKENS, self.frontend.runner.context_length - longest)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        sampling["max_new_tokens"] = fallback if max_tokens is None else max_tokens
        for name, allowed in DEFAULT_ONLY.items():
            value = body.get(name)
            if value is None or any(value == a and type(value) is type(a) for a in allowed):
                continue
            if name == "tool_choice" and value == "none" and not tool_calls:
                continue  # no tools: no call is what happens anyway
            raise RequestError(f"{name}={value!r:.200} is not supported by the embedded engine (only "
                               f"{' or '.join(repr(a) for a in allowed)}, or leave it out)", param=name)
        if body.get("min_tokens") is not None:
            min_tokens = body["min_tokens"]
            if not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < 0:
                raise RequestError(f"min_tokens must be an integer >= 0, got {min_tokens!r:.200}", param="min_tokens")
            sampling["min_new_tokens"] = min_tokens
        if not isinstance(sampling["max_new_tokens"], int) or isinstance(sampling["max_new_tokens"], bool) \
                or sampling["max_new_tokens"] < 0:
            raise RequestError(f"max_tokens must be an integer >= 0, got {max_tokens!r}", param="max_tokens")
        params = parse_sampling_params(sampling)
        n = _int_field(body, "n", 1, 1)
        if n > MAX_N:
            raise RequestError(f"n={n} asks for more choices than one request may ({MAX_N}); send several "
                               f"requests", param="n")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(f"stream must be true or false, got {stream!r}", param="stream")
        if stream and (n > 1 or len(prompts) > 1):
            raise RequestError("streaming supports one prompt and n=1", param="n")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise RequestError(f"stream_options must be an object like {{\"include_usage\": true}}, got "
                               f"{options!r:.200}", param="stream_options")
        logprobs = body.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, (bool, int)):
            raise RequestError(f"logprobs must be a boolean or an integer, got {logprobs!r}", param="logprobs")
        for ids in prompts:
            self.frontend.check_length(len(ids), params)
        model = body.get("model") if isinstance(body.get("model"), str) else self.model_name
        return OpenAICall(prompts, params, n, stream, bool(options.get("include_usage")),
                          logprobs not in (None, False), model)

    def _completion_prompts(self, body: dict) -> list[list[int]]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return [self.frontend.prompt_ids(prompt, None)]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(p, str) for p in prompt):
                return [self.frontend.prompt_ids(p, None) for p in prompt]
            if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                return [self.frontend.prompt_ids(None, prompt)]
            if all(isinstance(p, list) for p in prompt):
                return [self.frontend.prompt_ids(None, p) for p in prompt]
        raise RequestError("prompt must be a string, a list of strings, or token ids", param="prompt")

    def _chat_prompt(self, body: dict, parser=None) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
        plain = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise RequestError(f"messages[{i}] must be an object with a string `role`", param="messages")
            if m["role"] not in CHAT_ROLES:  # the template would render any other as it is (N44)
                raise RequestError(f"messages[{i}].role is {m['role']!r:.40}; it must be one of "
                                   f"{', '.join(CHAT_ROLES)}", param="messages")
            content = m.get("content")
            if isinstance(content, list):  # OpenAI content parts: keep the text ones
                content = _text_parts(content, i)
            if not isinstance(content, str):
                if content is None and m.get("tool_calls"):
                    content = ""
                else:
                    raise RequestError(f"messages[{i}].content must be text", param="messages")
            if m["role"] == "assistant":
                content = assistant_text(m, content, parser)
            plain.append({"role": m["role"], "content": content})
        tools = {"tools": body["tools"]} if parser is not None else {}
        # special tokens' text inside the messages stays text (B3): `encode` is None when there is none
        text, encode = render_chat(self.frontend.tokenizer, plain, **tools)
        return self.frontend.prompt_ids(text, None, encode=encode)

    # ---- routes ---------------------------------------------------------------------------------------
    async def completions(self, request: Request):
        body = _object(await read_json(request))
        prompts = await self.frontend.off_loop(self._completion_prompts, body)
        call = await self.frontend.off_loop(self._call, body, prompts, COMPLETIONS_DEFAULT_MAX_TOKENS)
        if call.stream:
            return self._stream(call, chat=False)
        results = await self._run(call)
        choices = [{"index": i, "text": self._text(r, call.params), "finish_reason": r.finish_reason.type,
                    "matched_stop": r.finish_reason.matched,
                    "logprobs": self._completion_logprobs(r) if call.logprobs else None}
                   for i, r in enumerate(results)]
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": call.model, "choices": choices, "usage": _usage(results)}

    async def chat_completions(self, request: Request):
        body = _object(await read_json(request))
        parser = request_parser(body, self.tool_call_parser)
        prompt = await self.frontend.off_loop(self._chat_prompt, body, parser)
        call = await self.frontend.off_loop(self._call, body, [prompt], None, parser is not None)
        if call.stream:
            if parser is not None:
                raise RequestError("streaming is not supported with tools", param="stream")
            return self._stream(call, chat=True)
        results = await self._run(call)
        choices = []
        for i, r in enumerate(results):
            message, finish = {"role": "assistant", "content": self._text(r, call.params)}, None
            if parser is not None:
                message, finish = tool_message(self._text(r, call.params), parser)
            choices.append({"index": i, "message": message, "finish_reason": finish or r.finish_reason.type,
                            "matched_stop": r.finish_reason.matched,
                            "logprobs": self._chat_logprobs(r) if call.logprobs else None})
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": call.model, "choices": choices, "usage": _usage(results)}

    async def _run(self, call: OpenAICall) -> list[GenerationResult]:
        requests = [(ids, call.params, uuid.uuid4().hex) for ids in call.prompts for _ in range(call.n)]
        channels = self.frontend.submit_all(requests)
        return list(await asyncio.gather(*(c.result() for c in channels)))

    def _text(self, result: GenerationResult, params: SamplingParams) -> str:
        return final_text(self.frontend.tokenizer, result.output_ids, params, result.finish_reason)

    def _chat_logprobs(self, result: GenerationResult) -> dict:
        tok = self.frontend.tokenizer
        content = []
        for token_id, lp in zip(result.output_ids, result.output_logprobs):
            piece = tok.decode([token_id])
            content.append({"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []})
        return {"content": content}

    def _completion_logprobs(self, result: GenerationResult) -> dict:
        tok = self.frontend.tokenizer
        tokens = [tok.decode([t]) for t in result.output_ids]
        offsets, at = [], 0
        for piece in tokens:
            offsets.append(at)
            at += len(piece)
        return {"tokens": tokens, "token_logprobs": list(result.output_logprobs), "top_logprobs": None,
                "text_offset": offsets}

    def _stream(self, call: OpenAICall, chat: bool) -> StreamingResponse:
        rid = uuid.uuid4().hex
        channel = self.frontend.submit(call.prompts[0], call.params, rid, stream=True)
        stream_id = f"{'chatcmpl' if chat else 'cmpl'}-{rid}"
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, finish: str | None, role: bool = False) -> dict:
            if chat:
                body: dict[str, Any] = {} if delta is None else {"content": delta}
                if role:
                    body["role"] = "assistant"
                choice = {"index": 0, "delta": body, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            return {"id": stream_id, "object": kind, "created": created, "model": call.model, "choices": [choice]}

        async def events():
            text = IncrementalText(self.frontend.tokenizer, call.params)
            ids: list[int] = []
            if chat:
                yield sse(chunk("", None, role=True))
            async for event in channel.events():
                if isinstance(event, TokenEvent):
                    ids.append(event.token_id)
                    delta = text.update(ids)
                    if delta:
                        yield sse(chunk(delta, None))
                    continue
                result = event.result
                delta = text.finish(result.output_ids, result.finish_reason)
                if delta:
                    yield sse(chunk(delta, None))
                yield sse(chunk(None, result.finish_reason.type))
                if call.include_usage:
                    yield sse({"id": stream_id, "object": kind, "created": created, "model": call.model,
                               "choices": [], "usage": _usage([result])})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def _usage(results: list[GenerationResult]) -> dict:
    # n samples of one prompt count the prompt once, as OpenAI does.
    prompt = sum(len(r.prompt_ids) for r in {id(r.prompt_ids): r for r in results}.values())
    completion = sum(len(r.output_ids) for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
