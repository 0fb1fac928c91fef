"""Where a run's MLflow store is by default, and one writer at a time while a SQLite store is set up.

Runs beside each other (the run dirs in one folder: `runs/` of a checkout, or the folder of a sweep's
`--run-dir`s) share one store, FOLDER/mlflow.db, with its artifacts in FOLDER/mlartifacts/<run id>/:
MLflow's run list, compare view and charts then show all of them, and any run's printed
`mlflow ui` command opens a UI in which every run's link works. `--mlflow-tracking-uri
sqlite:///RUN_DIR/mlflow.db` gives a run a store of its own. Parallel runs may create the shared store
together: MLflow creates its tables and miles the experiment under a file lock beside the database.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from miles.record import layout
from miles.record.files import file_lock

SQLITE = "sqlite:///"


def default_store_uri(run_dir: Path) -> str:
    """sqlite:///FOLDER/mlflow.db for a run dir in FOLDER (`run_dir` absolute)."""
    return f"{SQLITE}{Path(run_dir).parent / layout.MLFLOW_DB}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a SQLite tracking URI, None for any other store."""
    return Path(uri[len(SQLITE) - 1:]) if uri.startswith(SQLITE) else None


def artifact_dir(uri: str, run_dir: Path) -> str | None:
    """Where a local store keeps artifacts: beside a SQLite database (so runs sharing a store share the
    experiment's artifact root, a folder per run under it), RUN_DIR/mlartifacts for another local store,
    None for a tracking server (it has its own)."""
    db = sqlite_path(uri)
    if db is not None:
        return str(db.parent / layout.MLARTIFACTS)
    local = uri.startswith("file:") or "://" not in uri
    return str(Path(run_dir) / layout.MLARTIFACTS) if local else None


@contextlib.contextmanager
def store_lock(uri: str):
    """An exclusive lock on DB.lock for a SQLite store (a no-op for any other): MLflow's first use of a new
    database creates its tables, and two processes doing so at once fail ("table ... already exists")."""
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    with file_lock(db.with_name(db.name + ".lock")):
        yield
