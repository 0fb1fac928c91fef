"""The engine's front end: the request path from HTTP to the scheduler, shared by /generate and the OpenAI routes.

It turns a prompt into checked token ids (tokenizing on its own thread, so the event loop keeps
answering), checks each request against the model's limits, and submits it to the scheduler,
handing back a `RequestChannel` whose events arrive on the event loop.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator

from miles.engines.model_runner import ModelRunner
from miles.engines.routing_capture import check_asked
from miles.engines.sglang_request import GenerationResult, RequestError, SamplingParams
from miles.engines.scheduler import EngineRequest, FinishEvent, Scheduler, TokenEvent

# NFC normalisation can fold up to 3 code points into one; 4 keeps the character bound below safe.
NORMALISATION_SLACK = 4


def longest_token_chars(tokenizer) -> int:
    """The most characters one vocabulary entry spans: a prompt of N characters needs at least
    N / (this * NORMALISATION_SLACK) tokens, so an over-long prompt is refused without tokenizing it."""
    return max(1, max(len(piece) for piece in tokenizer.get_vocab()))


class RequestChannel:
    """The server side of one submitted request: scheduler events arrive on an asyncio queue, or, for a
    request that is not streamed (it gets no token events), its result on one future, `finished` (a
    rollout's 256 samples made 256 queues, async generators and tasks on the HTTP thread, whose GIL the
    scheduler thread shares). Cancelling `finished` (the client went away) aborts the request."""

    def __init__(self, scheduler: Scheduler, rid: str, stream: bool = True):
        self.scheduler = scheduler
        self.rid = rid
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue | None = asyncio.Queue() if stream else None
        if stream:
            self.sink = lambda event: loop.call_soon_threadsafe(self.queue.put_nowait, event)
            return
        self.finished: asyncio.Future = loop.create_future()
        self.finished.add_done_callback(self._abandoned)
        self.sink = lambda event: loop.call_soon_threadsafe(_settle, self.finished, event)

    def _abandoned(self, finished: asyncio.Future) -> None:
        if finished.cancelled():  # nobody waits for it any more: stop spending compute on it
            self.scheduler.abort(self.rid)

    async def events(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        if self.queue is None:
            yield FinishEvent(await self.finished)
            return
        finished = False
        try:
            while not finished:
                event = await self.queue.get()
                finished = isinstance(event, FinishEvent)
                yield event
        finally:
            if not finished:  # the client went away: stop spending compute on it
                self.scheduler.abort(self.rid)

    async def result(self) -> GenerationResult:
        if self.queue is None:
            return await self.finished
        async for event in self.events():
            if isinstance(event, FinishEvent):
                return event.result
        raise RuntimeError("request ended without a result")  # events() always ends on a FinishEvent


def _settle(finished: asyncio.Future, event: TokenEvent | FinishEvent) -> None:
    if isinstance(event, FinishEvent) and not finished.done():
        finished.set_result(event.result)


class EngineFrontend:
    """Checked prompts and requests in, channels of scheduler events out."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler):
        self.runner, self.scheduler = runner, scheduler
        self.tokenizer = runner.tokenizer  # encodes on the tokenizer thread only
        # Tokenizing a long prompt takes seconds: one thread does it so the event loop keeps answering.
        self._tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="engine-tokenize")
        self.max_prompt_chars = runner.context_length * longest_token_chars(runner.tokenizer) * NORMALISATION_SLACK
        self.started_at = time.time()

    def close(self) -> None:
        self._tokenizer_thread.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, fn, *args):
        """Run `fn(*args)` (tokenizing) on the tokenizer thread."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, fn, *args)

    def prompt_ids(self, text: str | None, input_ids: list[int] | None, encode=None) -> list[int]:
        """Token ids of a prompt, checked; call it off the event loop (`off_loop`) when it tokenizes. `encode`
        replaces the tokenizer's own encoding of `text` (a chat prompt whose messages hold special tokens)."""
        if text is not None:
            if len(text) > self.max_prompt_chars:
                raise RequestError(f"The input ({len(text)} characters) is longer than the model's context length "
                                   f"({self.runner.context_length} tokens) can hold.", param="text")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RequestError(f"text is not valid Unicode: {exc.reason} at position {exc.start}",
                                   param="text") from None
        if input_ids is not None:
            ids = list(input_ids)
        else:
            ids = encode(text) if encode is not None else self.tokenizer.encode(text, add_special_tokens=True)
        if not ids:
            raise RequestError("the prompt is empty", param="text")
        vocab = self.runner.config.vocab_size
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise RequestError(f"input_ids holds token id {bad}, outside the vocabulary (size {vocab})",
                               param="input_ids")
        return ids

    def check_length(self, prompt_len: int, params: SamplingParams) -> None:
        """The prompt and the request's token-level params fit this model (checked per request, before it
        joins a batch, so a bad one fails alone)."""
        vocab = self.runner.config.vocab_size
        bad = next((t for t in params.stop_token_ids if t >= vocab), None)
        if bad is not None:
            raise RequestError(f"sampling_params.stop_token_ids holds {bad}, outside the vocabulary (size {vocab})",
                               param="stop_token_ids")
        limit = self.runner.context_length
        if prompt_len >= limit:
            raise RequestError(f"The input ({prompt_len} tokens) is longer than the model's context length "
                               f"({limit} tokens).", param="text")
        if prompt_len + params.max_new_tokens > limit:
            raise RequestError(f"Requested token count exceeds the model's maximum context length of {limit} "
                               f"tokens. You requested a total of {prompt_len + params.max_new_tokens} tokens: "
                               f"{prompt_len} tokens from the input and {params.max_new_tokens} tokens for the "
                               f"completion (max_new_tokens).", param="max_new_tokens")

    def submit(self, prompt_ids: list[int], params: SamplingParams, rid: str, stream: bool = False,
               routed_experts: bool = False) -> RequestChannel:
        """`routed_experts`: the request asked for `return_routed_experts` (a dense model refuses it)."""
        self.check_length(len(prompt_ids), params)
        check_asked(routed_experts, getattr(self.runner, "routing", None))
        channel = RequestChannel(self.scheduler, rid, stream)
        self.scheduler.submit(EngineRequest(rid=rid, prompt_ids=prompt_ids, params=params, sink=channel.sink,
                                            stream=stream, return_routed_experts=routed_experts))
        return channel

    def submit_all(self, requests: list[tuple]) -> list[RequestChannel]:
        """Submit several (ids, params, rid[, routed_experts]) requests; if one is refused (queue full),
        abort the ones already queued."""
        channels: list[RequestChannel] = []
        try:
            for ids, params, rid, *routed in requests:
                channels.append(self.submit(ids, params, rid, routed_experts=bool(routed and routed[0])))
        except RequestError:
            for channel in channels:
                self.scheduler.abort(channel.rid)
            raise
        return channels
