"""The engine's scheduler thread: queue requests, decode them together in one continuous batch, hand back results.

Requests wait in a FIFO queue. Before every decode step the thread admits waiting requests
into the free rows of the running batch (up to `max_batch_size` rows): it prefills them as
one left-padded group, samples their first token, and merges their KV cache into the
running one, so they decode together with the rows already running from the next step on.
A finished row leaves the batch and its cache at once. Work that must not overlap decoding
(weight swaps, profiler start/stop) waits until the running batch is empty; while it waits
no request is admitted, so every response comes from exactly one weight version.

SGLang's `/pause_generation` modes change that for async training: `in_place` freezes the running
rows where they are (their KV cache kept) and `retract` puts them back at the head of the queue
(re-prefilled, prompt and tokens so far, on continue); either way work waiting for the batch to
empty (a weight swap) runs at once, and the rows go on under the new weights after
`/continue_generation`. Every token records the weight version that sampled it.
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
from miles.engines.model_runner import ModelRunner, StepState
from miles.engines.routing_capture import joined, record_decode, record_prefill
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
    weight_version: str = "default"  # of the weights it was admitted under (constant while it runs)
    output_versions: list[str] = field(default_factory=list)  # the weight version that sampled each token
    finished: bool = False
    sampler: RowSampler | None = None  # its own params and random generator, made when it is admitted
    return_routed_experts: bool = False  # keep the experts each read token was routed to
    routed_experts: list = field(default_factory=list)  # their (tokens, layers, top_k) chunks


@dataclass(frozen=True)
class SchedulerStats:
    num_running_reqs: int
    num_queue_reqs: int
    num_batches: int            # prefill groups admitted into the running batch
    max_batch_size_seen: int    # most rows one decode step (or one prefill group) held
    mean_batch_size: float      # mean rows per decode step
    num_decode_steps: int
    num_joined_running: int     # requests admitted while other requests were mid-decode
    paused: bool


class QueueFull(RequestError):
    def __init__(self, limit: int):
        super().__init__(f"the engine's queue is full ({limit} waiting requests); retry later", status=503)


PAUSE_MODES = ("abort", "retract", "in_place")  # SGLang's PauseGenerationReqInput.mode
IDLE_GAP_S = 0.05  # idle time that ends a stretch of decoding (one timeline span)


@dataclass
class RunningBatch:
    """The rows decoding now, in the order of their KV-cache rows, and the token each feeds next."""

    rows: list[EngineRequest]
    state: StepState
    next_tokens: list[int]


class Scheduler:
    def __init__(self, runner: ModelRunner, metrics: EngineMetrics, max_batch_size: int, max_queued: int,
                 weight_version: str = "default", timeline: TimelineWriter | None = None):
        self.runner = runner
        self.timeline = timeline or TimelineWriter(None)  # one span per busy stretch, when the run asked for it
        self._busy: dict[str, float] | None = None  # the stretch of back-to-back steps going on
        self.metrics = metrics
        self.max_batch_size = max_batch_size
        self.max_queued = max_queued
        self.weight_version = weight_version
        self._waiting: collections.deque[EngineRequest] = collections.deque()
        self._running: list[EngineRequest] = []  # read by abort() and stats() under the lock
        self._batch: RunningBatch | None = None  # the scheduler thread's own
        self._controls: collections.deque[tuple[Callable[[], object], Future]] = collections.deque()
        self._cond = threading.Condition()
        self._stop = False
        self._paused = False
        self._frozen = False  # paused in place or retracted: running rows take no decode step
        self._thread: threading.Thread | None = None
        self._seeds = random.Random()  # seeds the generators of requests that bring no seed
        self._stop_tokenizer = type(runner.tokenizer).from_pretrained(runner.model_path)  # own copy: not shared
        self._num_batches = 0
        self._num_steps = 0
        self._stepped_rows = 0
        self._joined_running = 0
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
                if (rid is None or req.rid == rid) and not req.finished:
                    req.abort_requested = True  # it leaves the batch at its next token
                    found += 1
            self.metrics.num_queue_reqs.set(len(self._waiting))
            return found

    def call_between_batches(self, fn: Callable[[], object]) -> Future:
        """Run `fn` on the scheduler thread once no request is running; none is admitted until it ran."""
        future: Future = Future()
        with self._cond:
            self._controls.append((fn, future))
            self._cond.notify_all()
        return future

    def set_paused(self, paused: bool) -> None:
        """Paused: no waiting request is admitted; the running ones decode to their end. Unpaused: also
        ends a `pause` (frozen rows decode again, retracted ones are admitted again)."""
        with self._cond:
            self._paused = paused
            if not paused:
                self._frozen = False
            self._cond.notify_all()

    def pause(self, mode: str) -> Future:
        """SGLang's pause modes: `abort` ends every request; `in_place` freezes the running rows with their
        cache; `retract` moves them back to the head of the queue. The future resolves (to the number of
        requests paused) once the scheduler thread took no further step: a weight swap queued after it then
        runs at once, with requests in flight."""
        if mode not in PAUSE_MODES:
            raise RequestError(f"mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r:.100}")
        if mode == "abort":
            self.abort(None)
        with self._cond:
            self._paused, self._frozen = True, mode != "abort"
        return self.call_between_batches(self._retract if mode == "retract" else self._count_running)

    def _count_running(self) -> int:
        return len(self._batch.rows) if self._batch is not None else 0

    def _retract(self) -> int:
        """(scheduler thread) The running rows go back to the head of the queue, in order; their cache is
        dropped and rebuilt from prompt + tokens so far when they are admitted again."""
        rows = list(self._batch.rows) if self._batch is not None else []
        self._batch = None
        with self._cond:
            self._waiting.extendleft(reversed(rows))
            self._running = []
            self.metrics.num_queue_reqs.set(len(self._waiting))
        return len(rows)

    def stats(self) -> SchedulerStats:
        with self._cond:
            mean = self._stepped_rows / self._num_steps if self._num_steps else 0.0
            return SchedulerStats(len(self._running), len(self._waiting), self._num_batches, self._max_seen,
                                  round(mean, 3), self._num_steps, self._joined_running, self._paused)

    # ---- the scheduler thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            idled = False  # waited for work since the last step (a gap in which the thread was only descheduled is not idle)
            with self._cond:
                while not (self._stop or (self._running and not self._frozen) or self._controls
                           or (self._waiting and not self._paused)):
                    idled = True
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
                controls: list = []
                if self._controls and (self._frozen or not self._running):
                    controls, self._controls = list(self._controls), collections.deque()
                admitted: list[EngineRequest] = []
                if not (self._paused or self._controls or controls):
                    room = self.max_batch_size - len(self._running)
                    if self._running and not self.runner.merges_batches:
                        room = 0  # this model's cache cannot take rows mid-decode: batches run to their end
                    admitted = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
                    if admitted and self._running:
                        self._joined_running += len(admitted)
                    self._running = self._running + admitted
                frozen = self._frozen
                self.metrics.num_queue_reqs.set(len(self._waiting))
                self.metrics.num_running_reqs.set(len(self._running))
            for fn, future in controls:
                self._run_control(fn, future)
            if admitted or (self._batch is not None and not frozen):
                self._run_step(admitted, idled)
            with self._cond:
                self._running = list(self._batch.rows) if self._batch is not None else []
                self.metrics.num_running_reqs.set(len(self._running))
        if self._busy is not None:
            self._write_busy_span()
        self._drain()

    @staticmethod
    def _run_control(fn: Callable[[], object], future: Future) -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # handed to the caller, who answers the HTTP request
            future.set_exception(exc)

    def _run_step(self, admitted: list[EngineRequest], idled: bool = False) -> None:
        """Admit `admitted` into the running batch, then decode one token for every row. `idled`: the loop
        waited for work since the last step."""
        started, wall_start = time.perf_counter(), time.time()
        generated = self._admit_safely(admitted) if admitted else 0
        if self._batch is not None:
            generated += self._decode_safely()
        elapsed = time.perf_counter() - started
        if idled and self._busy is not None and wall_start - self._busy["end"] > IDLE_GAP_S:
            # the engine idled in between (e.g. paused) and work came before the idle check wrote the span: a
            # new stretch. A longer gap with work waiting (the thread descheduled on a loaded machine) is not
            # idling: the stretch goes on
            self._write_busy_span()
        busy = self._busy or {"start": wall_start, "batches": 0, "requests": 0, "tokens": 0}
        busy.update(end=wall_start + elapsed, batches=busy["batches"] + bool(admitted),
                    requests=busy["requests"] + len(admitted), tokens=busy["tokens"] + generated)
        self._busy = busy

    # ---- admission: prefill a group, sample its first tokens, merge it into the running batch -------------
    def _admit_safely(self, group: list[EngineRequest]) -> int:
        """Admit `group`; if its prefill breaks, retry its requests one at a time, so only the request that
        breaks fails (the running batch is not touched). Returns the tokens generated."""
        try:
            return self._admit(group)
        except Exception as exc:  # the loop must survive; each request learns why it ended
            log.exception("prefill of %d requests failed", len(group))
            unstarted = [r for r in group if not r.finished and not r.output_ids]
            for req in group:
                if not req.finished and req.output_ids:  # tokens already went out: cannot start over
                    self._finish(req, FinishReason("abort", message=f"engine error: {exc!r}"))
            if len(group) == 1:
                for req in unstarted:
                    self._finish(req, FinishReason("abort", message=f"engine error: {exc!r}"))
                return 0
            return sum(self._admit_safely([req]) for req in unstarted)

    def _admit(self, group: list[EngineRequest]) -> int:
        version = self.weight_version
        live = [r for r in group if not self._finished_before_start(r, version)]
        if not live:
            return 0
        self._num_batches += 1
        self._max_seen = max(self._max_seen, len(live))
        for req in live:
            if req.sampler is None:  # a retracted request keeps its version of admission and its generator
                req.weight_version = version
                req.sampler = RowSampler(req.params, self._generator(req.params.seed))
        self.metrics.prompt_tokens.inc(sum(len(r.prompt_ids) for r in live))
        logits, state = self.runner.prefill([r.prompt_ids + r.output_ids for r in live])
        record_prefill(self.runner.routing, live)
        joined = RunningBatch(live, state, [])
        self._sample_and_retire(joined, logits)
        if joined.rows:
            if self._batch is None:
                self._batch = joined
            else:
                self._batch.state.merge(joined.state)
                self._batch.rows += joined.rows
                self._batch.next_tokens += joined.next_tokens
        return len(live)

    # ---- decoding: one token for every running row ------------------------------------------------------
    def _decode_safely(self) -> int:
        batch = self._batch
        try:
            return self._decode(batch)
        except Exception as exc:  # every row has sent tokens already: none can start over
            log.exception("decode step of %d requests failed", len(batch.rows))
            for req in batch.rows:
                if not req.finished:
                    self._finish(req, FinishReason("abort", message=f"engine error: {exc!r}"))
            self._batch = None
            return 0

    def _decode(self, batch: RunningBatch) -> int:
        rows = len(batch.rows)
        self._num_steps += 1
        self._stepped_rows += rows
        self._max_seen = max(self._max_seen, rows)
        self.metrics.batch_size.observe(rows)
        started = time.perf_counter()
        logits = self.runner.decode(batch.next_tokens, batch.state)
        record_decode(self.runner.routing, batch.rows)
        self._sample_and_retire(batch, logits)
        if not batch.rows:
            self._batch = None
        elapsed = time.perf_counter() - started
        self.metrics.gen_throughput.set(rows / elapsed if elapsed > 0 else 0.0)
        return rows

    def _sample_and_retire(self, batch: RunningBatch, logits: torch.Tensor) -> None:
        """Choose each row's next token from `logits` (one row each); finished rows leave the batch."""
        for req in batch.rows:
            req.sampler.banned = self._banned(req)
        chosen = choose(logits, [r.sampler for r in batch.rows])
        # counted before any row's answer is sent: a client that scrapes /metrics once its answer arrived
        # found one token fewer (the count came after the loop that finishes rows)
        self.metrics.generation_tokens.inc(len(batch.rows))
        keep, next_tokens = [], []
        for i, (req, token, logprob) in enumerate(zip(batch.rows, chosen.token_ids, chosen.logprobs)):
            reason = self._append(req, token, logprob)
            if reason is None:
                keep.append(i)
                next_tokens.append(token)
            else:
                self._finish(req, reason, req.weight_version)
        if len(keep) < len(batch.rows) and keep:
            batch.state.keep_rows(keep)
        batch.rows = [batch.rows[i] for i in keep]
        batch.next_tokens = next_tokens

    def _write_busy_span(self) -> None:
        """One timeline span for steps run with gaps under IDLE_GAP_S (written once the engine idled
        that long, so a rollout's thousands of steps cost a few writes)."""
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
        req.output_versions.append(self.weight_version)
        if req.stream:
            req.sink(TokenEvent(token, logprob, self.weight_version))
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
            output_logprobs=list(req.output_logprobs), output_versions=list(req.output_versions),
            finish_reason=reason,
            weight_version=version or self.weight_version, e2e_latency=latency,
            routed_experts=joined(self.runner.routing, req.routed_experts) if req.return_routed_experts
            else None)))

    def _drain(self) -> None:
        """On shutdown, end whatever still waits so no client hangs."""
        with self._cond:
            waiting, self._waiting = list(self._waiting), collections.deque()
            controls, self._controls = list(self._controls), collections.deque()
        for req in waiting:
            self._finish(req, FinishReason("abort", message="engine shutting down"))
        for _, future in controls:
            future.set_exception(RuntimeError("engine shutting down"))
