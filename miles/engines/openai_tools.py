"""OpenAI `tools` on /v1/chat/completions: assistant `tool_calls` rendered into the prompt, and the
model's tool calls parsed out of its answer, in the engine's `--tool-call-parser` format."""
from __future__ import annotations

import json
import uuid
from typing import Any

from miles.engines.sglang_request import RequestError
from miles.rollout.tool_calls import TOOL_CALL_END, ToolCall, ToolCallParser, make_parser


def request_parser(body: dict, parser_name: str | None) -> ToolCallParser | None:
    """The parser for a request with `tools` (None without them); a 400 when the engine has no parser."""
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of {type: function, function: {...}} objects", param="tools")
    if parser_name is None:
        raise RequestError("this engine was started without --tool-call-parser, so it cannot parse tool calls",
                           param="tools")
    try:
        return make_parser(parser_name, tools)
    except ValueError as exc:
        raise RequestError(str(exc), param="tools") from None


def assistant_text(message: dict, content: str, parser: ToolCallParser | None) -> str:
    """An assistant message's text with its `tool_calls` rendered the way the model writes them."""
    calls = message.get("tool_calls") or []
    if not calls:
        return content
    if not isinstance(calls, list):
        raise RequestError(f"tool_calls must be a list of {{type, function: {{name, arguments}}}} objects, got "
                           f"{_short(calls)}", param="messages")
    if parser is None:
        raise RequestError("messages carry tool_calls but the request has no tools", param="messages")
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(f"bad tool call in messages: {_short(call)} (give \"function\": {{\"name\": ..., "
                               f"\"arguments\": ...}})", param="messages")
        arguments = function.get("arguments") or {}
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError as exc:
            raise RequestError(f"bad tool call in messages: arguments of {function['name']!r} are not JSON "
                               f"({exc})", param="messages") from None
        if not isinstance(arguments, dict):
            raise RequestError(f"bad tool call in messages: arguments of {function['name']!r} must be a JSON "
                               f"object, got {_short(arguments)}", param="messages")
        try:
            content += parser.render_call(ToolCall(function["name"], arguments))
        except ValueError as exc:
            raise RequestError(f"bad tool call in messages: {_short(call)} ({exc})", param="messages") from None
    return content


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def stop_at_call_end(sampling: dict) -> None:
    """Stop the turn when the model closes a tool call (its result is the client's to supply)."""
    stop = sampling.get("stop") or []
    if not isinstance(stop, (str, list)):
        raise RequestError(f"stop must be a string or a list of strings, got {_short(stop)}", param="stop")
    stop = [stop] if isinstance(stop, str) else list(stop)
    sampling["stop"] = stop + [TOOL_CALL_END]
    sampling["no_stop_trim"] = True  # the parser needs the closing marker


def tool_message(text: str, parser: ToolCallParser) -> tuple[dict[str, Any], str | None]:
    """(the chat message, finish_reason override): `tool_calls` when the text holds well-formed calls."""
    parsed = parser.parse(text)
    if not parsed.calls:
        return {"role": "assistant", "content": text}, None
    calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
              "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in parsed.calls]
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}, "tool_calls"
