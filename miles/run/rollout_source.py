"""Where the iteration's rollout comes from: made when the trainer asks (`SyncRollouts`, the
synchronous schedule), or generated ahead by async GRPO's producer (`AsyncRollouts`:
--max-weight-staleness K > 0, or --fully-async). The iteration reads the same with either: it
`take`s the rollout, tells the source which weights it `pushed` (pausing the engines as the
source's `pause_mode` says) and adds what the source `observe`s to the line; a checkpoint saves its
`cursor`.

K = 0 without --fully-async is `SyncRollouts`: no thread, the same draws and requests in the same
order as before there were sources, so the synchronous journal stays what it was, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from miles.rollout.data import DataSource
from miles.rollout.producer import RolloutProducer, Taken
from miles.rollout.sample import Sample
from miles.rollout.staleness import staleness_metrics
from miles.run.staleness_guard import StalenessGuard, resumed_bound

# make(rollout_id, prompts, tokenizer, admit=None) -> (samples, advantages): a RolloutMaker
Make = Callable[..., tuple[list[Sample], list[float]]]


@dataclass
class Rollout:
    """One rollout as the trainer takes it."""

    samples: list[Sample]
    advantages: list[float]

    def metrics(self, step_time: float) -> dict[str, float]:
        """What the source adds to the iteration's line once the step's time is known."""
        return {}


@dataclass
class AheadRollout(Rollout):
    """A rollout the producer generated ahead of training."""

    taken: Taken
    trained_version: int  # the weight version this rollout trains on
    max_staleness: int  # the bound K it was generated under

    def metrics(self, step_time: float) -> dict[str, float]:
        """Staleness (in weight versions, against the version trained on), the buffer, and how much
        of the generation the trainer did not wait for."""
        wait, generate_time = self.taken.wait_time, self.taken.ready.generate_time
        out = staleness_metrics(self.samples, self.trained_version)
        out.update({"rollout/buffer_size": float(self.taken.buffer_size),
                    "rollout/max_weight_staleness": float(self.max_staleness),
                    "perf/wait_time": wait, "perf/rollout_generate_time": generate_time,
                    "perf/overlap_time": max(generate_time - wait, 0.0),
                    "perf/trainer_idle_ratio": wait / step_time if step_time > 0 else 0.0})
        return out


class RolloutSource(Protocol):
    """What the iteration needs of its rollouts."""

    pause_mode: str | None  # how a weight push pauses the engines' requests; None: none in flight

    def take(self, rollout_id: int) -> Rollout: ...

    def pushed(self, version: int) -> None:
        """Every engine serves `version` now (the trainer's weight push returned)."""

    def observe(self, rollout_id: int, metrics: dict[str, float]) -> dict[str, float]:
        """What the source adds to the line once the iteration's metrics are all in."""

    def restart(self, version: int, journal: list, rollout_id: int) -> None:
        """The trainer resumed from checkpoint `rollout_id` (-1: none) serving `version`; `journal`
        holds the run's journal lines."""

    def cursor(self) -> dict:
        """The data cursor that a checkpoint of the rollout trained last saves."""

    def stop(self) -> None: ...


class SyncRollouts:
    """Rollout j is made when the trainer asks for it, after the push of rollout j - 1."""

    pause_mode = None  # nothing generates while the weights are pushed

    def __init__(self, data: DataSource, batch_size: int, make: Make, tokenizer):
        self.data, self.batch_size, self.make, self.tokenizer = data, batch_size, make, tokenizer

    def take(self, rollout_id: int) -> Rollout:
        prompts = self.data.next_batch(self.batch_size)
        return Rollout(*self.make(rollout_id, prompts, self.tokenizer))

    def pushed(self, version: int) -> None:
        pass

    def observe(self, rollout_id: int, metrics: dict[str, float]) -> dict[str, float]:
        return {}

    def restart(self, version: int, journal: list, rollout_id: int) -> None:
        pass

    def cursor(self) -> dict:
        return self.data.state_dict()

    def stop(self) -> None:
        pass


class AsyncRollouts:
    """Async GRPO: a `RolloutProducer`, started at the first `take` (and again after a resume),
    generates ahead at most K weight versions stale; --staleness-guard may tighten K after an
    iteration, and the tightened K outlives a resume (read back from the journal)."""

    def __init__(self, train_config, data: DataSource, batch_size: int, make: Make,
                 new_tokenizer: Callable):
        self.train_config, self.data, self.batch_size = train_config, data, batch_size
        self.make, self.new_tokenizer = make, new_tokenizer
        self.pause_mode = train_config.pause_generation_mode
        self.guard = StalenessGuard(train_config) if train_config.staleness_guard else None
        self.version, self.max_staleness = 0, train_config.max_weight_staleness
        self.producer: RolloutProducer | None = None
        self._trained_cursor: dict | None = None  # the producer's draws run ahead of this one

    def take(self, rollout_id: int) -> Rollout:
        if self.producer is None:
            # its own tokenizer: a fast tokenizer is not safe to share between threads
            tokenizer = self.new_tokenizer()
            self.producer = RolloutProducer(
                draw=lambda j: (self.data.next_batch(self.batch_size), self.data.state_dict()),
                generate=lambda j, prompts, admit: self.make(j, prompts, tokenizer, admit),
                first=rollout_id, version=self.version, max_staleness=self.max_staleness,
                overlap=self.train_config.fully_async)
        taken = self.producer.take(rollout_id)
        self._trained_cursor = taken.ready.cursor
        samples, advantages = taken.ready.result
        return AheadRollout(samples, advantages, taken, self.version, self.producer.max_staleness)

    def pushed(self, version: int) -> None:
        self.version = version
        if self.producer is not None:
            self.producer.pushed(version)  # requests waiting for this version may start

    def observe(self, rollout_id: int, metrics: dict[str, float]) -> dict[str, float]:
        """The staleness guard's verdict on the iteration (it may tighten K)."""
        if self.guard is None or self.producer is None:
            return {}
        out = self.guard.observe(rollout_id, metrics, self.producer)
        self.max_staleness = self.producer.max_staleness
        return out

    def restart(self, version: int, journal: list, rollout_id: int) -> None:
        self.version, self._trained_cursor = version, None
        self.max_staleness = resumed_bound(self.train_config, journal, rollout_id)

    def cursor(self) -> dict:
        return self._trained_cursor or self.data.state_dict()

    def stop(self) -> None:
        """What the producer generated ahead belongs to weights being replaced (or to a run that
        ends): requests still running finish, their rollouts are dropped."""
        if self.producer is not None:
            self.producer.close()
            self.producer = None


def rollout_source(train_config, data: DataSource, batch_size: int, make: Make, tokenizer,
                   new_tokenizer: Callable) -> SyncRollouts | AsyncRollouts:
    """`AsyncRollouts` with --max-weight-staleness > 0 or --fully-async, else `SyncRollouts`."""
    if train_config.fully_async or train_config.max_weight_staleness > 0:
        return AsyncRollouts(train_config, data, batch_size, make, new_tokenizer)
    return SyncRollouts(data, batch_size, make, tokenizer)
