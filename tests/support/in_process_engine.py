"""Requests driven in process through the embedded engine's Scheduler on the real model runner:
each tracked request records its tokens as they come and can run hooks at its k-th token (on the
scheduler thread, between two steps), so a test orders arrivals and pauses without timing."""
from __future__ import annotations

from concurrent.futures import Future

from miles.engines.model_runner import ModelRunner
from miles.engines.scheduler import EngineRequest, FinishEvent, Scheduler, TokenEvent
from miles.engines.sglang_request import SamplingParams

TIMEOUT_S = 120.0


class Tracked:
    """One submitted request: its tokens as they come, its result, hooks run at its k-th token."""

    def __init__(self, scheduler: Scheduler, rid: str, prompt: list[int], params: SamplingParams):
        self.scheduler, self.rid = scheduler, rid
        self.tokens: list[int] = []
        self.done: Future = Future()
        self.at_token: dict[int, list] = {}
        self.request = EngineRequest(rid=rid, prompt_ids=prompt, params=params, sink=self._sink,
                                     stream=True)

    def on_token(self, k: int, fn) -> "Tracked":
        self.at_token.setdefault(k, []).append(fn)
        return self

    def _sink(self, event) -> None:
        if isinstance(event, TokenEvent):
            self.tokens.append(event.token_id)
            for fn in self.at_token.get(len(self.tokens), []):
                fn()
        else:
            assert isinstance(event, FinishEvent)
            self.done.set_result(event.result)

    def submit(self) -> "Tracked":
        self.scheduler.submit(self.request)
        return self

    def result(self):
        return self.done.result(timeout=TIMEOUT_S)


def params(max_new_tokens: int, seed: int, temperature: float = 1.0) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, ignore_eos=True,
                          seed=seed)


def prompt(runner: ModelRunner, text: str) -> list[int]:
    return runner.tokenizer.encode(text, add_special_tokens=True)


def alone(scheduler: Scheduler, rid: str, ids: list[int], p: SamplingParams):
    return Tracked(scheduler, rid, ids, p).submit().result()
