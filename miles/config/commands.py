"""How a printed hint spells one of the installed commands (`miles`, `mlflow`, `wandb`, `prefect`) so that
it runs when pasted: the bare name when the shell finds this installation's copy on PATH, else its path in
this environment's bin folder (after `make run` the venv is not activated, and a bare `miles` is "command
not found")."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def bin_dir() -> Path:
    """The bin folder of the running interpreter's environment (not resolved: a venv's python is a link)."""
    return Path(sys.executable).parent


def runnable(name: str, path: str | None = None) -> str:
    """`name` when PATH (default: this process's) finds the copy in `bin_dir()`; else that copy's path,
    relative to the working directory when it lies below it (`.venv/bin/miles`). A name this environment
    does not hold is returned as it is."""
    mine = bin_dir() / name
    if not mine.exists():
        return name
    found = shutil.which(name, path=os.environ.get("PATH", "") if path is None else path)
    if found and Path(found).parent == mine.parent:
        return name
    try:
        return str(mine.relative_to(Path.cwd()))
    except ValueError:
        return str(mine)
