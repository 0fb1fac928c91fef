"""The engine's scheduler thread: queue requests, decode them together in batches, hand back results.

Requests wait in a FIFO queue; the thread takes up to `max_batch_size` of them, runs them
as one left-padded batch to completion (finished rows leave the batch and its KV cache
at once), then takes the next batch. Work that must not overlap a batch (weight swaps)
runs between batches, so every response comes from exactly one weight version.
"""
from __future__ import annotations

import collections
import logging
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import torch

from miles.engines.metrics import EngineMetrics
from miles.engines.model_runner import ModelRunner
from miles.engines.sglang_request import FinishReason, GenerationResult, RequestError, SamplingParams
from miles.engines.sampling import RowSampler, choose
from miles.record.timeline import TimelineWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    logprob: float
    weight_version: str


@dataclass(frozen=True)
class FinishEvent:
    result: GenerationResult


Sink = Callable[[TokenEvent | FinishEvent], None]


@dataclass
class EngineRequest:
    """One request as the scheduler tracks it; `sink` is called from the scheduler thread."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: Sink
    stream: bool = False
    created: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    abort_requested: bool = False
    first_token_at: float | None = None
    weight_version: str = "default"  # of the batch decoding it
    finished: bool = False


@dataclass(frozen=True)
class SchedulerStats:
    num_running_reqs: int
    num_queue_reqs: int
    num_batches: int
    max_batch_size_seen: int
    mean_batch_size: float
    paused: bool


class QueueFull(RequestError):
    def __init__(self, limit: int):
        super().__init__(f"the engine's queue is full ({limit} waiting requests); retry later", status=503)


IDLE_GAP_S = 0.05  # idle time that ends a stretch of decoding (one timeline span)


class Scheduler:
    def __init__(self, runner: ModelRunner, metrics: EngineMetrics, max_batch_size: int, max_queued: int,
                 weight_version: str = "default", timeline: TimelineWriter | None = None):
        self.runner = runner
        self.timeline = timeline or TimelineWriter(None)  # one span per busy stretch, when the run asked for it
        self._busy: dict[str, float] | None = None  # the stretch of back-to-back batches going on
        self.metrics = metrics
        self.max_batch_size = max_batch_size
        self.max_queued = max_queued
        self.weight_version = weight_version
        self._waiting: collections.deque[EngineRequest] = collections.deque()
        self._running: list[EngineRequest] = []
        self._controls: collections.deque[tuple[Callable[[], object], Future]] = collections.deque()
        self._cond = threading.Condition()
        self._stop = False
        self._paused = False
        self._thread: threading.Thread | None = None
        self._seeds = random.Random()  # seeds the generators of requests that bring no seed
        self._stop_tokenizer = type(runner.tokenizer).from_pretrained(runner.model_path)  # own copy: not shared
        self._num_batches = 0
        self._batched_requests = 0
        self._max_seen = 0

    # ---- called from the server's threads -------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread:
            self._thread.join(timeout=30)

    def submit(self, request: EngineRequest) -> None:
        with self._cond:
            if len(self._waiting) >= self.max_queued:
                raise QueueFull(self.max_queued)
            self._waiting.append(request)
            self.metrics.num_queue_reqs.set(len(self._waiting))
            self._cond.notify_all()

    def abort(self, rid: str | None) -> int:
        """Abort one request by id (None: all of them); returns how many were found."""
        with self._cond:
            found = 0
            for req in list(self._waiting):
                if rid is None or req.rid == rid:
                    self._waiting.remove(req)
                    self._finish(req, FinishReason("abort", message="aborted by /abort_request"))
                    found += 1
            for req in self._running:
                if rid is None or req.rid == rid:
                    req.abort_requested = True
                    found += 1
            self.metrics.num_queue_reqs.set(len(self._waiting))
            return found

    def call_between_batches(self, fn: Callable[[], object]) -> Future:
        future: Future = Future()
        with self._cond:
            self._controls.append((fn, future))
            self._cond.notify_all()
        return future

    def set_paused(self, paused: bool) -> None:
        with self._cond:
            self._paused = paused
            self._cond.notify_all()

    def stats(self) -> SchedulerStats:
        with self._cond:
            mean = self._batched_requests / self._num_batches if self._num_batches else 0.0
            return SchedulerStats(len(self._running), len(self._waiting), self._num_batches, self._max_seen,
                                  round(mean, 3), self._paused)

    # ---- the scheduler thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._controls or (self._waiting and not self._paused)):
                    if self._busy is None:
                        self._cond.wait()
                        continue
                    left = self._busy["end"] + IDLE_GAP_S - time.time()
                    if left > 0:
                        self._cond.wait(timeout=left)
                    else:
                        self._write_busy_span()  # idle for a while: the stretch of decoding is over
                if self._stop:
                    break
                controls = list(self._controls)
                self._controls.clear()
                batch = [] if self._paused else [self._waiting.popleft()
                                                 for _ in range(min(self.max_batch_size, len(self._waiting)))]
                self._running = batch
                self.metrics.num_queue_reqs.set(len(self._waiting))
                self.metrics.num_running_reqs.set(len(batch))
            for fn, future in controls:
                self._run_control(fn, future)
            if batch:
                self._run_batch_safely(batch)
            with self._cond:
                self._running = []
                self.metrics.num_running_reqs.set(0)
        if self._busy is not None:
            self._write_busy_span()
        self._drain()

    @staticmethod
    def _run_control(fn: Callable[[], object], future: Future) -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # handed to the caller, who answers the HTTP request
            future.set_exception(exc)

    def _run_batch_safely(self, batch: list[EngineRequest]) -> None:
        try:
            self._run_batch(batch)
        except Exception as exc:  # the loop must survive; each request learns why it ended
            log.exception("batch of %d requests failed", len(batch))
            unstarted = [r for r in batch if not r.finished and not r.output_ids]
            for req in batch:
                if not req.finished and req.output_ids:  # tokens already went out: cannot start over
                    self._finish(req, FinishReason("abort", message=f"engine error: {exc!r}"))
            if len(batch) == 1:
                for req in unstarted:
                    self._finish(req, FinishReason("abort", message=f"engine error: {exc!r}"))
                return
            for req in unstarted:  # one at a time, so only the request that breaks fails
                self._run_batch_safely([req])

    def _run_batch(self, batch: list[EngineRequest]) -> None:
        self._num_batches += 1
        self._batched_requests += len(batch)
        self._max_seen = max(self._max_seen, len(batch))
        self.metrics.batch_size.observe(len(batch))
        started, wall_start = time.perf_counter(), time.time()
        version = self.weight_version
        live = [r for r in batch if not self._finished_before_start(r, version)]
        if not live:
            return
        for req in live:
            req.weight_version = version
        samplers = {id(r): RowSampler(r.params, self._generator(r.params.seed)) for r in live}
        self.metrics.prompt_tokens.inc(sum(len(r.prompt_ids) for r in live))
        logits, state = self.runner.prefill([r.prompt_ids for r in live])
        generated = 0
        while live:
            rows = [samplers[id(r)] for r in live]
            for req, row in zip(live, rows):
                row.banned = self._banned(req)
            chosen = choose(logits, rows)
            keep, next_tokens = [], []
            for i, (req, token, logprob) in enumerate(zip(live, chosen.token_ids, chosen.logprobs)):
                generated += 1
                reason = self._append(req, token, logprob)
                if reason is None:
                    keep.append(i)
                    next_tokens.append(token)
                else:
                    self._finish(req, reason, version)
            self.metrics.generation_tokens.inc(len(live))
            if not keep:
                break
            if len(keep) < len(live):
                state.keep_rows(keep)
                live = [live[i] for i in keep]
            logits = self.runner.decode(next_tokens, state)
        elapsed = time.perf_counter() - started
        self.metrics.gen_throughput.set(generated / elapsed if elapsed > 0 else 0.0)
        if self._busy is not None and wall_start - self._busy["end"] > IDLE_GAP_S:
            self._write_busy_span()  # the engine idled in between (e.g. paused): a new stretch
        busy = self._busy or {"start": wall_start, "batches": 0, "requests": 0, "tokens": 0}
        busy.update(end=wall_start + elapsed, batches=busy["batches"] + 1, requests=busy["requests"] + len(batch),
                    tokens=busy["tokens"] + generated)
        self._busy = busy

    def _write_busy_span(self) -> None:
        """One timeline span for batches decoded with gaps under IDLE_GAP_S (written once the engine idled
        that long, so a rollout's hundreds of small batches cost a few writes)."""
        b, self._busy = self._busy, None
        self.timeline.add("decode", b["start"], b["end"], batches=int(b["batches"]), requests=int(b["requests"]),
                          tokens=int(b["tokens"]))

    def _finished_before_start(self, req: EngineRequest, version: str) -> bool:
        if req.abort_requested:
            self._finish(req, FinishReason("abort", message="aborted by /abort_request"), version)
            return True
        if req.params.max_new_tokens == 0:
            self._finish(req, FinishReason("length", matched=0), version)
            return True
        return False

    def _generator(self, seed: int | None) -> torch.Generator:
        gen = torch.Generator(device=self.runner.device)
        gen.manual_seed(seed if seed is not None else self._seeds.getrandbits(63))
        return gen

    def _banned(self, req: EngineRequest) -> tuple[int, ...]:
        if len(req.output_ids) >= req.params.min_new_tokens:
            return ()
        eos = () if req.params.ignore_eos else self.runner.eos_ids
        return (*eos, *req.params.stop_token_ids)

    def _append(self, req: EngineRequest, token: int, logprob: float) -> FinishReason | None:
        """Record one token; return why the request is done, or None to go on (SGLang's checks, in order)."""
        now = time.perf_counter()
        if req.first_token_at is None:
            req.first_token_at = now
            self.metrics.time_to_first_token.observe(now - req.created)
        req.output_ids.append(token)
        req.output_logprobs.append(logprob)
        if req.stream:
            req.sink(TokenEvent(token, logprob, req.weight_version))
        if req.abort_requested:
            return FinishReason("abort", message="aborted by /abort_request")
        if not req.params.ignore_eos and token in self.runner.eos_ids:
            return FinishReason("stop", matched=token)
        if token in req.params.stop_token_ids:
            return FinishReason("stop", matched=token)
        if req.params.stop:
            matched = self._matched_stop(req)
            if matched is not None:
                return FinishReason("stop", matched=matched)
        if len(req.output_ids) >= req.params.max_new_tokens:
            return FinishReason("length", matched=len(req.output_ids))
        return None

    def _matched_stop(self, req: EngineRequest) -> str | None:
        # A new match ends in the newest token and spans at most len(stop) tokens; decode a little more.
        window = max(len(s) for s in req.params.stop) + 2
        tail = self._stop_tokenizer.decode(req.output_ids[-window:],
                                           skip_special_tokens=req.params.skip_special_tokens)
        return next((s for s in req.params.stop if s in tail), None)

    def _finish(self, req: EngineRequest, reason: FinishReason, version: str | None = None) -> None:
        req.finished = True
        latency = time.perf_counter() - req.created
        self.metrics.record_finish(req, reason.type, latency)
        req.sink(FinishEvent(GenerationResult(
            rid=req.rid, prompt_ids=req.prompt_ids, output_ids=list(req.output_ids),
            output_logprobs=list(req.output_logprobs), finish_reason=reason,
            weight_version=version or self.weight_version, e2e_latency=latency)))

    def _drain(self) -> None:
        """On shutdown, end whatever still waits so no client hangs."""
        with self._cond:
            waiting, self._waiting = list(self._waiting), collections.deque()
            controls, self._controls = list(self._controls), collections.deque()
        for req in waiting:
            self._finish(req, FinishReason("abort", message="engine shutting down"))
        for _, future in controls:
            future.set_exception(RuntimeError("engine shutting down"))
