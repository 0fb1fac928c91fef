"""The multi-turn task: two-digit multiplication, hard in one shot for the tiny model, easy with `calc`.

A prompt is `37*58=` with label `2146`. The policy may answer at once (`2146`), or call the
calculator and copy its result:

    37*58=<tool_call>calc 37*58</tool_call><tool_response>2146</tool_response>2146<|im_end|>
          ^ model turn 1 ^^^^^^^^^^^^^^^^^^^^ observation (not trained) ^^^^^^^^ model turn 2

The reward is an exact match of the final turn. Train and eval sets are disjoint and fixed by
the seed; the files are Miles' JSONL like the addition task's.
"""
from __future__ import annotations

from pathlib import Path

from miles.rollout.tool_calls import TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END
from miles.tiny.task import Problem, held_out, write_splits

LOW, HIGH = 10, 99
EVAL_SIZE = 256


def all_problems() -> list[Problem]:
    return [Problem(f"{a}*{b}=", str(a * b)) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)]


def split_problems(seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) of the multiplication problems, EVAL_SIZE held out."""
    return held_out(all_problems(), seed, EVAL_SIZE)


def write_task_data(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write train.jsonl and eval.jsonl into `directory` (if missing); return their paths."""
    return write_splits(directory, *split_problems(seed))


def tool_turn(problem: Problem) -> str:
    """The first model turn of the tool path: the call, in the `tiny` parser's format."""
    return f"{TOOL_CALL}calc {problem.prompt.rstrip('=')}{TOOL_CALL_END}"


def observation(problem: Problem) -> str:
    return f"{TOOL_RESPONSE}{problem.label}{TOOL_RESPONSE_END}"


def demonstration(problem: Problem, use_tool: bool) -> list[tuple[str, bool]]:
    """The response as (text, trained) pieces: a direct answer, or call -> observation -> answer."""
    if not use_tool:
        return [(problem.label, True)]
    return [(tool_turn(problem), True), (observation(problem), False), (problem.label, True)]
