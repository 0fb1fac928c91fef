"""Async GRPO's rollout producer: generate the next rollouts while the trainer trains, at most K weight
versions stale, with admission control on every request (AReaL's rule).

Rollout j trains on weight version v_j = v_0 + (j - j_0) (one push per rollout). A request of rollout j
starts only once the engines serve at least v_j - K (`WeightClock.admit`); every token is sampled by that
version or a newer one, so no token trains more than K versions stale, however long the request runs
or waits in the buffer. K = 0 is the synchronous schedule: rollout j starts after the push of j - 1.

Without `overlap` the producer generates one rollout at a time (Miles' train_async: the next rollout
while this one trains); with it (--fully-async) rollout j + 1 starts as soon as rollout j's requests
may start, so stragglers of one rollout overlap the next. The data cursor is drawn in rollout order in
the producer thread; each ready rollout carries the cursor after its draw, which is what a checkpoint
of that rollout saves (rollouts generated ahead are generated again after a resume).
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


class ProducerStopped(RuntimeError):
    """The producer was closed while a rollout waited for admission."""


class WeightClock:
    """The weight version every engine serves (as the trainer last pushed it), and the requests waiting
    for a version: threads wait with `wait_for`, a rollout's asyncio requests with `admit`."""

    def __init__(self, version: int):
        self._version = version
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event, int]] = []
        self._stopped = False

    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    def advance(self, version: int) -> None:
        """The engines serve `version` now: release what waited for it."""
        with self._cond:
            self._version = max(self._version, version)
            self._release()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._release()

    def _release(self) -> None:
        keep = []
        for loop, event, target in self._waiters:
            if self._stopped or self._version >= target:
                loop.call_soon_threadsafe(event.set)
            else:
                keep.append((loop, event, target))
        self._waiters = keep
        self._cond.notify_all()

    def wait_for(self, target: int) -> None:
        """Block this thread until the version reaches `target` (raises ProducerStopped when closed)."""
        with self._cond:
            while not (self._stopped or self._version >= target):
                self._cond.wait()
            if self._stopped:
                raise ProducerStopped("the rollout producer was closed")

    async def admit(self, target: int) -> int:
        """Wait (in the rollout's event loop) until the version reaches `target`; returns the version
        the request is admitted under."""
        with self._cond:
            if self._stopped:
                raise ProducerStopped("the rollout producer was closed")
            if self._version >= target:
                return self._version
            event = asyncio.Event()
            self._waiters.append((asyncio.get_running_loop(), event, target))
        await event.wait()
        with self._cond:
            if self._stopped:
                raise ProducerStopped("the rollout producer was closed")
            return self._version


@dataclass
class ReadyRollout:
    """One generated rollout, waiting in the buffer for the trainer."""

    rollout_id: int
    result: Any  # what `generate` returned (the trainer's samples and advantages)
    cursor: dict  # the data cursor after this rollout's prompts were drawn
    started: float  # perf_counter when its generation started
    finished: float  # ... and ended
    admitted_versions: list[int] = field(default_factory=list)  # the version each request started under

    @property
    def generate_time(self) -> float:
        return self.finished - self.started


@dataclass
class Taken:
    """What `RolloutProducer.take` hands the trainer: the rollout, how long the trainer waited for it, and
    how many rollouts were in the buffer (ready, this one included) when it was taken."""

    ready: ReadyRollout
    wait_time: float
    buffer_size: int


class RolloutProducer:
    """Generates rollouts `first, first + 1, ...` in background threads. `draw(j)` takes rollout j's prompts
    and returns them with the data cursor after the draw (called in order, in the producer thread);
    `generate(j, prompts, admit)` makes the rollout, awaiting `admit()` before each request starts."""

    def __init__(self, draw: Callable[[int], tuple[Any, dict]], generate: Callable[[int, Any, Callable], Any],
                 first: int, version: int, max_staleness: int, overlap: bool):
        self.draw, self.generate = draw, generate
        self.first, self.base_version = first, version
        self.max_staleness, self.overlap = max_staleness, overlap
        self.clock = WeightClock(version)
        self._cond = threading.Condition()
        self._ready: dict[int, ReadyRollout] = {}
        self._error: BaseException | None = None
        self._workers: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._produce, name="miles-rollout-producer", daemon=True)
        self._thread.start()

    # ---- the bound ---------------------------------------------------------------------------------
    def train_version(self, rollout_id: int) -> int:
        """The weight version rollout `rollout_id` trains on."""
        return self.base_version + rollout_id - self.first

    def admission_version(self, rollout_id: int) -> int:
        """The oldest weight version a request of `rollout_id` may start under."""
        return self.train_version(rollout_id) - self.max_staleness

    def set_max_staleness(self, k: int) -> None:
        """Tighten (or loosen) the bound for requests not yet admitted (--staleness-guard); requests
        already running keep the bound they started under."""
        with self._cond:
            self.max_staleness = k

    # ---- the trainer's side -----------------------------------------------------------------------
    def take(self, rollout_id: int) -> Taken:
        """Wait for rollout `rollout_id` (re-raising the producer's error, if it failed) and remove it from
        the buffer. The wait is interruptible (the stall reaction's SIGINT)."""
        started = time.perf_counter()
        with self._cond:
            while rollout_id not in self._ready and self._error is None:
                self._cond.wait(timeout=1.0)  # a timeout so that SIGINT reaches the main thread promptly
            if rollout_id not in self._ready:
                raise self._error
            buffer = len(self._ready)
            ready = self._ready.pop(rollout_id)
        return Taken(ready, time.perf_counter() - started, buffer)

    def pushed(self, version: int) -> None:
        """Every engine serves `version` now (the trainer's weight push returned)."""
        self.clock.advance(version)

    def close(self) -> None:
        """Stop admitting; requests already running finish (they are short), their rollouts are dropped."""
        self.clock.stop()
        self._thread.join(timeout=30)
        for worker in list(self._workers):
            worker.join(timeout=30)

    # ---- the producer threads ---------------------------------------------------------------------
    def _produce(self) -> None:
        rollout_id = self.first
        try:
            while True:
                # at most K + 1 rollouts ahead: rollout j starts once its requests may
                self.clock.wait_for(self.admission_version(rollout_id))
                prompts, cursor = self.draw(rollout_id)
                worker = threading.Thread(target=self._generate, args=(rollout_id, prompts, cursor), daemon=True,
                                          name=f"miles-rollout-{rollout_id}")
                self._workers = [w for w in self._workers if w.is_alive()] + [worker]
                worker.start()
                if not self.overlap:
                    worker.join()
                    if self._error is not None:
                        return
                rollout_id += 1
        except ProducerStopped:
            return
        except BaseException as exc:  # handed to the trainer's `take`
            self._fail(exc)

    def _generate(self, rollout_id: int, prompts: Any, cursor: dict) -> None:
        admitted: list[int] = []

        async def admit() -> None:
            with self._cond:
                target = self.admission_version(rollout_id)
            admitted.append(await self.clock.admit(target))

        started = time.perf_counter()
        try:
            result = self.generate(rollout_id, prompts, admit)
        except ProducerStopped:
            return
        except BaseException as exc:
            self._fail(exc)
            return
        with self._cond:
            self._ready[rollout_id] = ReadyRollout(rollout_id, result, cursor, started, time.perf_counter(), admitted)
            self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()
