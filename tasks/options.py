"""Retries, backoff and timeout from the orchestration flags, applied to any task.

One retry layer per kind of work: the service tasks (cluster, router, engines, registration,
ranks, finish) retry in place through Prefect, at most --task-retries times; a training chunk
is never retried in place (retries=False): the flow resubmits it after healing the engines,
at most --task-retries times, so it runs at most --task-retries + 1 times in all."""
from __future__ import annotations

from typing import TypeVar

from prefect import Task
from prefect.cache_policies import NO_CACHE

from miles.config import ConfigError, OrchestrationConfig

T = TypeVar("T", bound=Task)


def retry_delays(orchestration: OrchestrationConfig) -> list[float]:
    """Exponential backoff: the first delay, then doubling, one entry per retry."""
    return [orchestration.task_retry_delay * 2**i for i in range(orchestration.task_retries)]


def retry_unless_bad_input(task, task_run, state) -> bool:
    """A bad flag or path stays bad, and a health stop is meant to end the run: retrying those
    would only delay the error."""
    from miles.health import RedFlagStop

    return not isinstance(state.data, (ConfigError, RedFlagStop))


def with_run_retries(task: T, orchestration: OrchestrationConfig, retries: bool = True) -> T:
    """`task` with the run's retries, backoff and timeout. No result caching: every run of a
    task does its work again (a chunk resumes from its checkpoint, never from a cache)."""
    return task.with_options(
        retries=orchestration.task_retries if retries else 0,
        retry_delay_seconds=retry_delays(orchestration) if retries else 0,
        timeout_seconds=orchestration.task_timeout,
        retry_condition_fn=retry_unless_bad_input,
        cache_policy=NO_CACHE,
    )
