"""What `miles diagnose` may read and pack of a run dir: only its own files. A run dir is a folder anyone
who could write there may have shaped (a `metrics.jsonl` that links to ~/.netrc, a `tracking/` that links
to another directory), and the bundle is the file users attach to issues. So every file diagnose reads
or packs must resolve (symlinks and `..` followed) to a path inside the run dir; the others are left
out and named in the verdict's notes."""
from __future__ import annotations

import shutil
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


def confined_view(run_dir: Path, view: Path, leave_out: list[str]) -> Path:
    """A copy of the run's files that diagnose reads, without those in `leave_out` (ones that resolve
    outside the run dir): the readers of the journal, state and timeline then see only the run's own."""
    run = layout.RunLayout(run_dir)
    for key in READ:
        rel = layout.ENTRIES[key].path
        source = getattr(run, key)
        if rel in leave_out or not source.is_file() or source.stat().st_size > MAX_COPY:
            continue
        target = view / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return view
