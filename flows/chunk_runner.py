"""Run one training chunk to completion on Ray, resubmitting it if its Ray worker process dies.

Prefect retries a chunk that raises inside its task run. A chunk whose worker process is
killed takes Prefect's retry loop with it, and Ray must not re-run it unseen (max_retries=0),
so the flow marks that task run Crashed on the API and submits the chunk again: it resumes
from the chunk's checkpoint, and the API shows both attempts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import ray
from prefect import Task, get_run_logger
from prefect.client.orchestration import get_client
from prefect.states import Crashed

from tasks.chunks import Chunk
from tasks.faults import EngineDown
from tasks.training import ChunkResult

POLL_S = 0.5


def journal_lines(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(1 for _ in f)


def wait_with_progress(future, run_dir: Path, on_progress: Callable[[int], None]) -> None:
    """Block until the task's Ray object is ready, reporting the journal's length meanwhile."""
    while not ray.wait([future.wrapped_future], timeout=POLL_S)[0]:
        on_progress(journal_lines(run_dir))
    on_progress(journal_lines(run_dir))
    future.wait()


def mark_crashed(task_run_id, message: str) -> None:
    with get_client(sync_client=True) as client:
        client.set_task_run_state(task_run_id, Crashed(message=message), force=True)


def run_chunk_to_end(task: Task, chunk: Chunk, params: dict, crash_retries: int, run_dir: Path,
                     on_progress: Callable[[int], None], heal: Callable[[], None]) -> ChunkResult:
    """Submit the chunk; resubmit it after its worker died, or after `heal` relaunched a dead engine."""
    logger = get_run_logger()
    for attempt in range(crash_retries + 1):
        future = task.submit(chunk=chunk, **params)
        wait_with_progress(future, run_dir, on_progress)
        state = future.state
        if state.is_crashed():
            message = f"Ray worker of {task.name}[{chunk.first}-{chunk.stop}] died: {state.message}"
            mark_crashed(future.task_run_id, message)
        elif state.is_failed() and isinstance(future.result(raise_on_failure=False), EngineDown):
            message = f"{task.name}[{chunk.first}-{chunk.stop}] failed with an engine down"
            heal()
        else:
            return future.result()  # raises if the task failed after Prefect's own retries
        if attempt == crash_retries:
            raise RuntimeError(f"{message}; gave up after {crash_retries + 1} attempts")
        logger.warning(f"{message}; submitting it again (attempt {attempt + 2} of {crash_retries + 1}), "
                       f"it resumes from its checkpoint")
    raise AssertionError("unreachable")
