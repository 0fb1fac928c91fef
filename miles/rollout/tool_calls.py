"""Tool calls in model text: parsing them out of a turn (`--generate-tool-call-parser`), rendering
calls and tool results back into text, and running them with errors turned into observations.

Two formats share Qwen's `<tool_call>...</tool_call>` markers: `qwen25` puts a JSON object
`{"name": ..., "arguments": {...}}` between them (SGLang's parser name), `tiny` the compact
`NAME ARGUMENT` that a character-level model can learn in seconds (the argument fills the tool's
first parameter). Nothing here raises on bad model output: a malformed call, an unknown tool, a
tool that raises or times out all become an error text the model sees next turn.
"""
from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
_CALL = re.compile(re.escape(TOOL_CALL) + r"(.*?)" + re.escape(TOOL_CALL_END), re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn: its plain text, the well-formed calls, and what was malformed."""

    content: str  # the text outside the tool-call markers
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def wants_tools(self) -> bool:
        return bool(self.calls or self.errors)


def tool_names(specs: list[dict]) -> dict[str, dict]:
    """name -> the OpenAI-style function spec, from a list of {"type": "function", "function": {...}}."""
    out = {}
    for spec in specs:
        function = spec.get("function", spec) if isinstance(spec, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ValueError(f"a tool spec must be {{'type': 'function', 'function': {{'name': ...}}}}, got "
                             f"{_short(spec)}")
        _check_parameters(function)
        out[function["name"]] = function
    return out


def _check_parameters(function: dict) -> None:
    """The parts of a JSON-schema `parameters` the parsers read (`_first_parameter`) have their shapes."""
    name, params = function["name"], function.get("parameters")
    if params is None:
        return
    if not isinstance(params, dict):
        raise ValueError(f"tool {name!r}: parameters must be a JSON schema object, got {_short(params)}")
    required, properties = params.get("required"), params.get("properties")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        raise ValueError(f"tool {name!r}: parameters.required must be a list of names, got {_short(required)}")
    if properties is not None and not isinstance(properties, dict):
        raise ValueError(f"tool {name!r}: parameters.properties must be an object, got {_short(properties)}")


def _short(value, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _first_parameter(function: dict) -> str | None:
    params = function.get("parameters") or {}
    names = list(params.get("required") or []) or list((params.get("properties") or {}))
    return names[0] if names else None


class ToolCallParser:
    """Parses and renders one tool-call format for a fixed set of tool specs."""

    name = ""

    def __init__(self, specs: list[dict]):
        self.specs = specs
        self.functions = tool_names(specs)

    def parse(self, text: str) -> ParsedTurn:
        calls, errors = [], []
        for body in _CALL.findall(text):
            try:
                calls.append(self.parse_body(body))
            except ValueError as exc:
                errors.append(f"malformed tool call {body!r}: {exc}")
        content = _CALL.sub("", text)
        if TOOL_CALL in content:  # opened and never closed (the turn ended first)
            errors.append("malformed tool call: no closing " + TOOL_CALL_END)
            content = content[: content.index(TOOL_CALL)]
        return ParsedTurn(content, calls, errors)

    def parse_body(self, body: str) -> ToolCall:
        raise NotImplementedError

    def render_call(self, call: ToolCall) -> str:
        raise NotImplementedError

    def render_response(self, text: str) -> str:
        return f"{TOOL_RESPONSE}{text}{TOOL_RESPONSE_END}"


class QwenParser(ToolCallParser):
    name = "qwen25"

    def parse_body(self, body: str) -> ToolCall:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ValueError('expected {"name": ..., "arguments": {...}}')
        arguments = obj.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                raise ValueError("arguments are not a JSON object") from None
        if not isinstance(arguments, dict):
            raise ValueError("arguments are not a JSON object")
        return ToolCall(obj["name"], arguments)

    def render_call(self, call: ToolCall) -> str:
        return f"{TOOL_CALL}\n{json.dumps({'name': call.name, 'arguments': call.arguments})}\n{TOOL_CALL_END}"

    def render_response(self, text: str) -> str:
        return f"\n{TOOL_RESPONSE}\n{text}\n{TOOL_RESPONSE_END}\n"


class TinyParser(ToolCallParser):
    name = "tiny"

    def parse_body(self, body: str) -> ToolCall:
        name, _, argument = body.partition(" ")
        if not name:
            raise ValueError("no tool name")
        function = self.functions.get(name)
        param = _first_parameter(function) if function else None
        return ToolCall(name, {param or "input": argument})

    def render_call(self, call: ToolCall) -> str:
        values = list(call.arguments.values())
        if len(values) > 1:
            raise ValueError(f"the tiny format carries one argument, {call.name} got {len(values)}")
        return f"{TOOL_CALL}{call.name} {values[0] if values else ''}{TOOL_CALL_END}"


PARSERS: dict[str, type[ToolCallParser]] = {cls.name: cls for cls in (QwenParser, TinyParser)}


def make_parser(name: str, specs: list[dict]) -> ToolCallParser:
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {sorted(PARSERS)}")
    return PARSERS[name](specs)


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall | None  # None for a malformed call
    text: str  # what the model sees
    error: bool


async def run_tool_calls(parsed: ParsedTurn, parser: ToolCallParser,
                         execute: Callable[[str, dict], Awaitable[str]], timeout: float) -> list[ToolResult]:
    """Every call of the turn, in order, and one error result per malformed call."""
    results = [ToolResult(None, f"error: {message}", True) for message in parsed.errors]
    for call in parsed.calls:
        results.append(await _run_one(call, parser, execute, timeout))
    return results


async def _run_one(call: ToolCall, parser: ToolCallParser, execute, timeout: float) -> ToolResult:
    if call.name not in parser.functions:
        return ToolResult(call, f"error: unknown tool {call.name!r}", True)
    try:
        value = await asyncio.wait_for(execute(call.name, call.arguments), timeout)
    except asyncio.TimeoutError:
        return ToolResult(call, f"error: {call.name} timed out after {timeout:g}s", True)
    except Exception as exc:  # the tool's failure is the model's observation, never a crashed rollout
        return ToolResult(call, f"error: {type(exc).__name__}: {exc}", True)
    return ToolResult(call, str(value), False)
