"""`--ray-timeline`: Ray's task timeline (chrome://tracing JSON) saved into the run's profiler directory."""
from __future__ import annotations

from pathlib import Path

import ray

from miles.record import layout


def save_ray_timeline(run_dir: Path) -> Path:
    """Write `ray.timeline()` of the connected cluster to RUN_DIR/profiler/ray-timeline.json."""
    path = Path(run_dir) / layout.RAY_TIMELINE
    path.parent.mkdir(parents=True, exist_ok=True)
    ray.timeline(filename=str(path))
    return path
