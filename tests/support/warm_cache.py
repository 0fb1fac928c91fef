"""The cached tiny models, made in the background from the suite's first second (`make test`'s two workers).

On a machine without them (every CI run) the first test that needs the addition model made it in its worker,
one core for two minutes or more, while the other worker ran until it too needed a model and then waited on
the cache's lock with its core idle (50% busy for about a minute at a time in a clean-clone run). Made by a
process of their own, started as the session starts, neither worker is the one making them: both run tests
until each needs a model. The tests still ask for the models the usual way (`ensure_base_model`, the
`base_model` fixture): a model found made is used, one still being made is waited for on its lock, and if
this process failed, the first test to ask makes it and fails where it can be read."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MAKE = """
from miles.tiny.warmstart import ensure_base_model
from miles.tiny.tool_warmstart import ensure_tool_model
ensure_base_model(progress=False)  # the one most tests need, first
ensure_tool_model(progress=False)
"""


def missing() -> bool:
    from miles.tiny.recipes import base_model_dir, tool_model_dir

    return not all((model / "warmstart.json").exists() for model in (base_model_dir(), tool_model_dir()))


def start(log: Path) -> subprocess.Popen | None:
    """The maker's process when a model is missing, else None; its output goes to `log`."""
    if not missing():
        return None
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-c", MAKE], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2])


def stop(process: subprocess.Popen | None, log: Path) -> str | None:
    """End the maker if the suite ended first (it is ours: by its PID); a failure's log tail, else None."""
    if process is None:
        return None
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=60)
        return None
    if process.returncode != 0:
        return log.read_text(errors="replace")[-2000:]
    return None
