"""The built-in multi-turn generate function: generate, run the tool calls, append the results, repeat.

Use it with `--custom-generate-function-path miles.rollout.multi_turn.generate`. Each
assistant turn is one /generate call that stops at the end of a tool call; the tools'
results are appended as observation tokens, with loss mask 0 and rollout log-prob 0.0, so
only the model's own tokens are trained. Every turn of a trajectory carries the same routing
key, so the router keeps it on one engine (which can then reuse the conversation's prefix).
The trajectory ends at an answer without tool calls, at `--generate-max-turns` assistant
turns, or when the response reaches `--rollout-max-response-len` tokens.
"""
from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable

from miles.config import ConfigError
from miles.rollout.generate import GenerateFnInput, read_reply
from miles.rollout.plugins import load_function, load_object
from miles.rollout.routed_experts import read_routed_experts, stitched
from miles.rollout.sample import FINISH_TO_STATUS, Sample, Status
from miles.rollout.tool_calls import TOOL_CALL_END, ToolCallParser, make_parser, run_tool_calls


@dataclass(frozen=True)
class ToolSetup:
    parser: ToolCallParser
    execute: Callable[[str, dict], Awaitable[str]]
    max_turns: int
    timeout: float


def load_tool_setup(generate_config) -> ToolSetup:
    """The tool specs, parser and executor named by the `--generate-*` flags; ConfigError names a bad one."""
    return _load(generate_config.generate_tool_specs_path, generate_config.generate_tool_call_parser,
                 generate_config.generate_execute_tool_function_path, generate_config.generate_max_turns,
                 generate_config.generate_tool_timeout)


@functools.lru_cache(maxsize=None)
def _load(specs_path: str | None, parser_name: str, execute_path: str | None, max_turns: int,
          timeout: float) -> ToolSetup:
    if not specs_path:
        raise ConfigError("--generate-tool-specs-path", "the multi-turn generator needs the tool specs "
                                                        "(a dotted path to a list, e.g. miles.tiny.calculator.TOOL_SPECS)")
    if not execute_path:
        raise ConfigError("--generate-execute-tool-function-path", "the multi-turn generator needs the tool "
                                                                   "executor (an async fn(name, arguments) -> str)")
    specs = load_object(specs_path, "--generate-tool-specs-path")
    if not isinstance(specs, list) or not specs:
        raise ConfigError("--generate-tool-specs-path", f"{specs_path} must be a non-empty list of tool specs, "
                                                        f"got {type(specs).__name__}")
    try:
        parser = make_parser(parser_name, specs)
    except ValueError as exc:
        raise ConfigError("--generate-tool-specs-path", str(exc)) from None
    execute = load_function(execute_path, "--generate-execute-tool-function-path", 2, is_async=True)
    return ToolSetup(parser, execute, max_turns, timeout)


async def generate(input: GenerateFnInput) -> Sample:
    """Finish one sample as a conversation with tool calls (the contract of --custom-generate-function-path)."""
    tools = load_tool_setup(input.args)
    state, sample, params = input.state, input.sample, input.sampling_params
    tokenizer, budget = state.tokenizer, params["max_new_tokens"]
    routing_key = uuid.uuid4().hex
    prompt_ids, response_ids, loss_mask, log_probs = list(sample.tokens), [], [], []
    sample.turns = [{"role": "user", "text": sample.prompt}]
    tool_calls = tool_errors = 0
    routed: list = []  # (tokens read, answer length, routed experts) per turn, when the run asks
    status, hit_max_turns = Status.COMPLETED, False
    for turn in range(tools.max_turns):
        turn_params = {**params, "max_new_tokens": budget - len(response_ids), "seed": params["seed"] + turn,
                       "stop": [TOOL_CALL_END]}
        read = len(prompt_ids) + len(response_ids)
        reply = await state.generate(state.payload(prompt_ids + response_ids, turn_params),
                                     routing_key=routing_key)
        ids, lps, finish, sample.weight_version = read_reply(reply)
        if state.routing is not None:
            routed.append((read, len(ids), read_routed_experts(reply.get("meta_info") or {},
                                                               state.routing)))
        response_ids += ids
        loss_mask += [1] * len(ids)
        log_probs += lps
        text = tokenizer.decode(ids, skip_special_tokens=True)
        sample.turns.append({"role": "assistant", "text": text})
        status = FINISH_TO_STATUS.get(finish, Status.COMPLETED)
        if status is not Status.COMPLETED:
            break
        parsed = tools.parser.parse(text)
        if not parsed.wants_tools:
            break
        if turn == tools.max_turns - 1:
            hit_max_turns = True
            break
        results = await run_tool_calls(parsed, tools.parser, tools.execute, tools.timeout)
        tool_calls += len(results)
        tool_errors += sum(r.error for r in results)
        observation = "".join(tools.parser.render_response(r.text) for r in results)
        obs_ids = list(tokenizer(observation, add_special_tokens=False)["input_ids"])
        response_ids += obs_ids
        loss_mask += [0] * len(obs_ids)
        log_probs += [0.0] * len(obs_ids)
        for r in results:
            call = None if r.call is None else {"name": r.call.name, "arguments": r.call.arguments}
            sample.turns.append({"role": "tool", "text": r.text, "tool_call": call, "error": r.error})
        if len(response_ids) >= budget:  # no room left for the model to answer
            status = Status.TRUNCATED
            break
    sample.tokens = prompt_ids + response_ids
    sample.response_length = len(response_ids)
    sample.rollout_log_probs = log_probs
    sample.loss_mask = loss_mask
    sample.routed_experts = stitched(routed)
    sample.response = tokenizer.decode(response_ids, skip_special_tokens=True)
    sample.status = status
    sample.metadata.update(tool_calls=tool_calls, tool_errors=tool_errors, hit_max_turns=hit_max_turns)
    return sample
