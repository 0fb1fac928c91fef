"""Where `miles train` keeps its local Prefect server (MILES_PREFECT_HOME, default the miles cache's
prefect/) and the record of the one it started (server.json: its API URL and pid). Read by the flows,
which start and reuse that server, and by `miles doctor --env`, which reports it; Prefect itself is not
imported here."""
from __future__ import annotations

import json
import os
from pathlib import Path

from miles.config.cache import cache_root

HOME_ENV = "MILES_PREFECT_HOME"
RECORD = "server.json"


def default_state_dir() -> Path:
    return Path(os.environ.get(HOME_ENV, cache_root() / "prefect"))


def read_record(home: Path | None = None) -> tuple[str, int | None] | None:
    """(api_url, pid) of the server last started under `home`; None when there is no readable record."""
    try:
        known = json.loads(((home or default_state_dir()) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(known, dict) or not isinstance(known.get("api_url"), str):
        return None
    pid = known.get("pid")
    return known["api_url"], pid if isinstance(pid, int) else None


def write_record(home: Path, api_url: str, pid: int) -> None:
    (home / RECORD).write_text(json.dumps({"api_url": api_url, "pid": pid}))
