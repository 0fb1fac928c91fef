"""How far a run is while a chunk runs: the journal's length, on the terminal's bar and on the flow's
`grpo-progress` artifact (one poll feeds both)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import ray
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from miles.record.journal import count_rollouts

POLL_S = 0.5


def wait_with_progress(future, run_dir: Path, on_progress: Callable[[int], None]) -> None:
    """Block until the task's Ray object is ready, reporting the journal's length meanwhile."""
    while not ray.wait([future.wrapped_future], timeout=POLL_S)[0]:
        on_progress(count_rollouts(run_dir))
    on_progress(count_rollouts(run_dir))
    future.wait()


class ProgressBar:
    """Rollouts done: the terminal's progress bar (only on a TTY) and the `grpo-progress` artifact."""

    def __init__(self, total: int, run_dir: str):
        self.total, self.done = total, -1
        self.artifact = create_progress_artifact(progress=0.0, key="grpo-progress", description=f"rollouts of {run_dir}")
        self.bar = Progress(TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(), TextColumn("rollouts"),
                            TimeElapsedColumn(), disable=not sys.stdout.isatty())
        self.task = self.bar.add_task("train", total=total)

    def __call__(self, done: int) -> None:
        self.bar.update(self.task, completed=done)
        if done != self.done:  # the artifact is a server call: only when the count moved
            self.done = done
            update_progress_artifact(self.artifact, 100.0 * min(done, self.total) / max(self.total, 1))

    def __enter__(self) -> "ProgressBar":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)
