"""`--ray-timeline`: Ray's task timeline (chrome://tracing JSON) saved into the run's profiler directory."""
from __future__ import annotations

from pathlib import Path

import ray

from miles.record import layout


def save_ray_timeline(run_dir: Path, path: Path | None = None) -> Path:
    """Write `ray.timeline()` of the connected cluster to RUN_DIR/profiler/ray-timeline.json (or `path`)."""
    path = Path(run_dir) / layout.RAY_TIMELINE if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ray.timeline(filename=str(path))
    return path
