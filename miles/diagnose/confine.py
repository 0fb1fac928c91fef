"""What `miles diagnose` may read and pack of a run dir: only its own files. A run dir is a folder anyone
who could write there may have shaped (a `metrics.jsonl` that links to ~/.netrc, a `tracking/` that links
to another directory), and the bundle is the file users attach to issues. So every file diagnose reads
or packs must resolve (symlinks and `..` followed) to a path inside the run dir; the others are left
out and named in the verdict's notes. So must every file be a regular one: opening a FIFO blocks until a
writer comes (probe DG4: a FIFO at timeline-open.jsonl hung diagnose, and the dashboard's Diagnose
request with it), so such a file is left out too, and a file is opened without blocking and checked
(`open_regular`) before it is read."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from miles.record import layout

# the run's files diagnose reads or packs (logs/ is checked file by file where it is read)
READ = ("journal", "health", "timeline", "timeline_open", "tracking_config", "trainer_state", "delivery_state",
        "delivery_log", "redone", "profiler_processes", "services", "profiler_summaries")
# a folder with none of these is not a run: what a trainer writes first (its lock, the phase starts),
# its journal, or what its tracker and profiler write
MARKERS = ("journal", "lock", "timeline_open", "timeline", "tracking_config", "trainer_state",
           "profiler_processes", "services")
MAX_COPY = 64 * 1024 * 1024


def inside(run_dir: Path, path: Path) -> bool:
    """`path` exists and resolves to a path inside `run_dir` (which may itself be reached through a link)."""
    try:
        return path.exists() and path.resolve().is_relative_to(Path(run_dir).resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


def is_run(run_dir: Path) -> bool:
    run = layout.RunLayout(run_dir)
    return any(inside(run_dir, getattr(run, key)) for key in MARKERS)


def escaping(run_dir: Path) -> list[str]:
    """The run-dir-relative names of the files diagnose reads that resolve outside the run dir."""
    run = layout.RunLayout(run_dir)
    found = []
    for key in READ:
        path = getattr(run, key)
        try:
            present = path.exists() or path.is_symlink()
        except OSError:
            present = False
        if present and not inside(run_dir, path):
            found.append(layout.ENTRIES[key].path)
    return found


def not_regular(run_dir: Path) -> list[str]:
    """The run-dir-relative names of the files diagnose reads that exist but are no regular file (a FIFO,
    a socket, a device, a folder): reading one could block for good."""
    run = layout.RunLayout(run_dir)
    found = []
    for key in READ:
        try:
            mode = os.stat(getattr(run, key)).st_mode
        except (OSError, ValueError):  # missing, a link loop (see `escaping`)
            continue
        if not stat.S_ISREG(mode):
            found.append(layout.ENTRIES[key].path)
    return found


def open_regular(path: Path):
    """`path` opened for binary reading if it is a regular file, else None: opened without blocking (a FIFO
    put there since a check opens at once) and checked on the open descriptor, then made blocking again."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def confined_view(run_dir: Path, view: Path, leave_out: list[str]) -> Path:
    """A copy of the run's files that diagnose reads, without those in `leave_out` (ones that resolve
    outside the run dir, or are no regular file): the readers of the journal, state and timeline then see
    only the run's own regular files."""
    run = layout.RunLayout(run_dir)
    for key in READ:
        rel = layout.ENTRIES[key].path
        if rel in leave_out:
            continue
        source = open_regular(getattr(run, key))
        if source is None:
            continue
        with source:
            if os.fstat(source.fileno()).st_size > MAX_COPY:
                continue
            target = view / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as out:
                shutil.copyfileobj(source, out)
    return view
