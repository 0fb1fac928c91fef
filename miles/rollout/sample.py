"""The unit of rollout data: one sampled response to one prompt (Miles' `Sample`).

Field names follow Miles so custom loggers and reward functions written for Miles
(`s.reward`, `s.response_length`, `s.status`, ...) work unchanged.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    COMPLETED = "completed"  # the engine stopped at EOS or a stop string
    TRUNCATED = "truncated"  # hit --rollout-max-response-len
    ABORTED = "aborted"  # the engine aborted the request


FINISH_TO_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


@dataclass
class Sample:
    index: int  # position in the rollout batch
    group_index: int  # which prompt (GRPO group) it answers
    prompt: str
    label: str | None
    tokens: list[int] = field(default_factory=list)  # prompt ids + response ids
    response: str = ""
    response_length: int = 0  # the last `response_length` of `tokens` are the response
    rollout_log_probs: list[float] = field(default_factory=list)  # engine log-prob of each response token
    status: Status = Status.COMPLETED
    weight_version: str | None = None  # engine weights that produced it (those it was admitted under)
    # The weight version of each response token when the engine reports them (a request can span a weight
    # update in async training); None: every token is `weight_version`'s.
    token_weight_versions: list[str] | None = None
    reward: float | None = None  # after any shaping; advantages come from this
    raw_reward: float | None = None  # the verifier's score
    metadata: dict[str, Any] = field(default_factory=dict)
    # Multi-turn: 1 per response token the model wrote, 0 per observation token (tool results), which
    # then stay out of the loss, the KL and the log-prob metrics. None: every response token is the model's.
    loss_mask: list[int] | None = None
    # The conversation turn by turn, [{"role": "user"|"assistant"|"tool", "text": ..., "tool_call": {...}}];
    # empty for a single-turn sample (its turns are the prompt and the response).
    turns: list[dict[str, Any]] = field(default_factory=list)
    # The experts the engine routed each token it read to: ints (tokens, MoE layers, top_k) in the
    # smallest integer type for the expert count, prompt and response but the last token (SGLang's
    # `return_routed_experts`). None: a dense policy, or not asked. Kept out of the sample tables.
    routed_experts: Any = None

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[len(self.tokens) - self.response_length:]

    @property
    def final_text(self) -> str:
        """What the reward checks: the last assistant turn, or the whole response of a single-turn sample."""
        replies = [t["text"] for t in self.turns if t["role"] == "assistant"]
        return replies[-1] if replies else self.response

    @property
    def num_turns(self) -> int:
        """Assistant turns (Miles' round number); 1 for a single-turn sample."""
        return sum(t["role"] == "assistant" for t in self.turns) or 1

    @property
    def truncated(self) -> bool:
        return self.status is Status.TRUNCATED
