"""The training ranks as Ray actors: created (optionally named after the run, see `RunNames`) or re-attached."""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import ray

from miles.backends import actor_class
from miles.backends.base import RankBatch, RankTrainResult
from miles.backends.rank_phases import settle_waits
from miles.cluster.names import NAMESPACE, RunNames

log = logging.getLogger(__name__)


def _named(names: RunNames, world_size: int) -> list[Any] | None:
    """The run's existing rank actors if all are there, else None."""
    handles = []
    for rank in range(world_size):
        try:
            handles.append(ray.get_actor(names.rank(rank), namespace=NAMESPACE))
        except ValueError:
            return None
    return handles


def end_survivors(names: RunNames, world_size: int) -> list[int]:
    """End the run's named ranks that outlived a lost peer (a rank killed for memory, a node
    gone): their process group is broken, and a new group cannot take their names while they
    live. Returns the ranks ended."""
    ended = []
    for rank in range(world_size):
        try:
            actor = ray.get_actor(names.rank(rank), namespace=NAMESPACE)
        except ValueError:
            continue
        ray.kill(actor, no_restart=True)
        ended.append(rank)
    if ended:
        log.warning("ended the surviving training ranks %s of %s: a peer was gone, so new ranks "
                    "start in their place", ended, names.prefix)
    _wait_names_free(names, ended)
    return ended


def _wait_names_free(names: RunNames, ranks: list[int], timeout_s: float = 30.0) -> None:
    """Ray frees a killed actor's name once the kill is processed."""
    deadline = time.monotonic() + timeout_s
    for rank in ranks:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(names.rank(rank), namespace=NAMESPACE)
            except ValueError:
                break
            time.sleep(0.1)


class ActorGroup:
    """`world_size` ranks; `attached` says they already existed (a retried task found them).

    With `wait=False` the ranks load the model and join their process group in the background (a plain run
    starts its engines meanwhile); `wait_started` blocks until they have, raising what a rank raised."""

    def __init__(self, config, model_path: str, names: RunNames | None = None, wait: bool = True):
        self.config, self.names = config, names
        self.world_size = config.world_size
        self._starting: list[Any] = []  # each rank's init, until `wait_started` has seen them end
        existing = _named(names, self.world_size) if names else None
        self.attached = existing is not None
        if existing is not None:
            self.actors = existing
            ray.get([a.info.remote() for a in self.actors])  # they answer: alive
            # every chunk after the first attaches (the ranks outlive it): routine, so not on stdout
            log.debug("attached to %d existing training actors %s", self.world_size, names.rank(0))
            return
        if names:
            end_survivors(names, self.world_size)
        cls = ray.remote(actor_class(config.train.train_backend))
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= self.world_size else 0
        threads = max(1, (os.cpu_count() or 1) // self.world_size)
        self.actors = []
        for rank in range(self.world_size):
            options: dict[str, Any] = dict(num_cpus=0, num_gpus=gpus, max_concurrency=1)
            if names:
                # Detached so a failed Prefect task's worker exiting does not take the ranks with it.
                options.update(name=names.rank(rank), namespace=NAMESPACE, lifetime="detached")
            self.actors.append(cls.options(**options).remote(config, rank, self.world_size, threads))
        # the port rank 0 bound as it picked it; each rank's init takes the reference and runs once it resolves
        port = self.actors[0].open_store.remote("127.0.0.1")
        self._starting = [a.init.remote(model_path, "127.0.0.1", port) for a in self.actors]
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Block until every rank has loaded the model and joined the process group (at once when they have)."""
        starting, self._starting = self._starting, []
        ray.get(starting)

    def kill(self) -> None:
        """End the ranks at once, started or not (a run that failed before its trainer took them)."""
        try:
            kill_ranks(self.actors)
        finally:
            self.actors = []

    def call(self, method: str, *args: Any) -> list[Any]:
        """Run a collective method on every rank; results in rank order."""
        return ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def call_timed(self, method: str, *args: Any) -> tuple[list[Any], list[float]]:
        """`call`, and the seconds until each rank's answer arrived (all start together)."""
        start = time.perf_counter()
        refs = [getattr(a, method).remote(*args) for a in self.actors]
        seconds: dict[Any, float] = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            seconds[done[0]] = time.perf_counter() - start
        return ray.get(refs), [seconds[ref] for ref in refs]

    def call_bounded(self, method: str, *args: Any, grace_s: float,
                     gone: Callable[[int], bool] = lambda rank: False,
                     hung: Callable[[int], bool] = lambda rank: False
                     ) -> tuple[list[Any], list[float]]:
        """`call_timed` of a collective whose waits the ranks bound themselves: once one rank has
        failed, the others get `grace_s` to fail too (or answer), and a rank that `gone(rank)`
        says will never answer (stopped, dead) is not waited for. A rank that `hung(rank)` says
        is stuck (its record silent past the deadline) counts as failed even when no other rank
        failed: a source rank stopped in its send to the engines has no peer to fail it. Raises
        `RankCallError` naming each rank that failed or did not answer."""
        start = time.perf_counter()
        refs = [getattr(a, method).remote(*args) for a in self.actors]
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        seconds: dict[int, float] = {}
        errors: dict[int, str] = {}
        pending, failed_at = list(refs), None
        while pending:
            if failed_at is not None:
                if time.perf_counter() > failed_at + grace_s:
                    break
                pending = [ref for ref in pending if not gone(rank_of[ref])]
                if not pending:
                    break
            done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in done:
                rank = rank_of[ref]
                seconds[rank] = time.perf_counter() - start
                try:
                    ray.get(ref)
                except Exception as exc:  # named in the RankCallError
                    errors[rank] = rank_error(exc)
                    failed_at = failed_at or time.perf_counter()
            if failed_at is None and any(hung(rank_of[ref]) for ref in pending):
                failed_at = time.perf_counter()
        silent = [rank_of[ref] for ref in refs if rank_of[ref] not in seconds]
        if errors or silent:
            raise RankCallError(method, errors, silent)
        return ray.get(refs), [seconds[rank] for rank in range(len(refs))]

    def train(self, batches: list[RankBatch]) -> list[RankTrainResult]:
        """One iteration on every rank; their phase marks settled into waits (`settle_waits`)."""
        results = ray.get([a.train.remote(b) for a, b in zip(self.actors, batches)])
        settle_waits([r.rank_spans for r in results if r.rank_spans is not None])
        return results

    def stop(self) -> None:
        """Leave the process group on every rank, then end the actors (no abort at exit)."""
        try:
            stop_ranks(self.actors)
        finally:
            self.actors = []


class RankCallError(RuntimeError):
    """A collective call failed on some ranks: each one's error, and the ranks that never
    answered."""

    def __init__(self, method: str, errors: dict[int, str], silent: list[int]):
        self.method, self.errors, self.silent = method, errors, silent
        parts = [f"rank {rank}: {error}" for rank, error in sorted(errors.items())]
        parts += [f"rank {rank} did not answer (stopped or hung)" for rank in silent]
        super().__init__(f"{method} failed on the training ranks: " + "; ".join(parts))


def rank_error(exc: BaseException) -> str:
    """A rank's error in one line: the raised exception's own line, not Ray's traceback."""
    if isinstance(exc, ray.exceptions.RayActorError):
        return "its process died (" + str(exc).strip().splitlines()[0][:200] + ")"
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {str(cause).strip()[:2000]}"
    lines = str(exc).strip().splitlines()
    return lines[-1][:2000] if lines else type(exc).__name__


def stop_ranks(actors: list[Any]) -> None:
    try:
        ray.get([a.shutdown.remote() for a in actors])
    finally:
        kill_ranks(actors)


def kill_ranks(actors: list[Any]) -> None:
    """End the rank actors without asking them first (none is restarted)."""
    for actor in actors:
        ray.kill(actor, no_restart=True)


def stop_named_group(names: RunNames, world_size: int) -> bool:
    """Stop a run's named ranks cleanly without building a trainer; False when they are gone."""
    actors = _named(names, world_size)
    if actors is None:
        return False
    stop_ranks(actors)
    return True
