"""Settings of custom and multi-turn generation: the generate hook, tools and turn limits (Miles' names)."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import flag


@dataclass(frozen=True)
class GenerateConfig:
    """How one sample is generated: one /generate call, or a custom function such as the multi-turn one."""

    custom_generate_function_path: str | None = flag(
        None, "dotted path of an async fn(GenerateFnInput) -> Sample that finishes one sample (e.g. "
              "miles.rollout.multi_turn.generate); default: one /generate call per sample")
    generate_max_turns: int = flag(16, "most assistant turns of a multi-turn trajectory", minimum=1)
    generate_tool_specs_path: str | None = flag(
        None, "dotted path of the list of OpenAI-style tool specs the multi-turn generator offers")
    generate_tool_call_parser: str = flag("qwen25", "format of tool calls in model text",
                                          choices=("qwen25", "tiny"))
    generate_execute_tool_function_path: str | None = flag(
        None, "dotted path of an async fn(name, arguments) -> str that runs one tool call")
    generate_tool_timeout: float = flag(10.0, "seconds a tool call may take before it becomes an error "
                                              "observation", minimum=0.001)
