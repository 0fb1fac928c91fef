"""Settings of the Prefect/Ray orchestration around the library."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import flag


@dataclass(frozen=True)
class OrchestrationConfig:
    """Ray cluster, chunking and task retries."""

    ray_address: str | None = flag(None, "existing Ray cluster, HOST:PORT (default: the job's cluster inside "
                                                 "`ray job submit`, else start a local one)")
    ray_num_cpus: int | None = flag(None, "CPUs of the local Ray (default: all)", minimum=1)
    ray_object_store_mb: int = flag(256, "object store of the local Ray, MiB", minimum=64)
    chunk_size: int = flag(10, "rollout iterations per training task", minimum=1)
    task_retries: int = flag(2, "retries per task; a training chunk runs at most this + 1 times in all", minimum=0)
    task_retry_delay: float = flag(2.0, "seconds before the first retry (doubles each time)", minimum=0.0)
    task_timeout: float = flag(3600.0, "seconds a task may run", minimum=1.0)
    inject_fault: str | None = flag(None, "test hook: raise@ITER or kill@ITER fails the run once at rollout ITER, "
                                          "kill-engine@ITER kills engine 0 there")
