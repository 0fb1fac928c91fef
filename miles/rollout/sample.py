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
    weight_version: str | None = None  # engine weights that produced it
    reward: float | None = None  # after any shaping; advantages come from this
    raw_reward: float | None = None  # the verifier's score
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[len(self.tokens) - self.response_length:]

    @property
    def truncated(self) -> bool:
        return self.status is Status.TRUNCATED
