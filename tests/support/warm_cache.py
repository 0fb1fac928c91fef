"""The cached tiny models, made in the background from the suite's first second (`make test`'s two workers).

On a machine without them (every CI run) the first test that needs the addition model made it in its worker,
one core for two minutes or more, while the other worker ran until it too needed a model and then waited on
the cache's lock with its core idle (50% busy for about a minute at a time in a clean-clone run). Made by a
process of their own, started as the session starts, neither worker is the one making them: both run tests
until each needs a model. The tests still ask for the models the usual way (`ensure_base_model`, the
`base_model` fixture): a model found made is used, one still being made is waited for on its lock, and if
this process failed, the first test to ask makes it and fails where it can be read.

`make test` makes them before the suite starts (`python -m tests.support.warm_cache`, below: each model in a
process of its own, one per core), so that its workers find them made; the background maker is for a pytest run
started another way on a machine without them."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BACKGROUND_MODELS = ("tiny addition model", "tiny tool model")  # the one most tests need first; not SmolLM2


def missing() -> bool:
    markers = suite_model_markers()
    return not all(markers[name].exists() for name in BACKGROUND_MODELS)


def start(log: Path) -> subprocess.Popen | None:
    """The maker's process when a model is missing, else None; its output goes to `log`."""
    if not missing():
        return None
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        make = "\n".join(SUITE_MODELS[name] for name in BACKGROUND_MODELS)  # one after the other
        return subprocess.Popen([sys.executable, "-c", make], stdout=out, stderr=subprocess.STDOUT,
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


# What `make test` makes before the suite: the two tiny models and SmolLM2 (tests/training/test_smollm2.py),
# the longest to make first (make_suite_models starts them in this order)
SUITE_MODELS = {
    "tiny addition model": "from miles.tiny.warmstart import ensure_base_model; ensure_base_model(progress=False)",
    "tiny tool model": "from miles.tiny.tool_warmstart import ensure_tool_model; ensure_tool_model(progress=False)",
    "SmolLM2-135M-Instruct": "from miles.config.checkpoints import CATALOG; from miles.pretrained.make import "
                             "make_checkpoint; make_checkpoint(CATALOG['smollm2-135m-instruct'])",
}


def suite_model_markers() -> dict[str, Path]:
    """Each model's marker file, written last when it is made (naming them loads no torch)."""
    from miles.config.checkpoints import CATALOG, MADE, checkpoint_dir
    from miles.tiny.recipes import base_model_dir, tool_model_dir

    return {"tiny addition model": base_model_dir() / "warmstart.json",
            "tiny tool model": tool_model_dir() / "warmstart.json",
            "SmolLM2-135M-Instruct": checkpoint_dir(CATALOG["smollm2-135m-instruct"]) / MADE}


def make_suite_models(lanes: int | None = None) -> int:
    """Make the suite's missing models, one process each, at most `lanes` (the machine's cores) at a time, in
    SUITE_MODELS's order (the longest first): each runs torch on one thread, so a third process on two cores
    only slowed the other two while the addition model, the longest, ended alone on one core. 0 when all are
    made, else 1 with each failure's output."""
    root = Path(__file__).resolve().parents[2]
    started = time.monotonic()
    missing_ones = [name for name, marker in suite_model_markers().items() if not marker.exists()]
    if not missing_ones:
        return 0
    lanes = max(1, min(lanes or os.cpu_count() or 1, len(missing_ones)))
    print(f"making the test suite's models once on this machine, {lanes} at a time: {', '.join(missing_ones)} "
          f"(minutes)", flush=True)
    failures: list[str] = []

    def make(name: str) -> None:
        done = subprocess.run([sys.executable, "-c", SUITE_MODELS[name]], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, cwd=root)
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-3000:]
            failures.append(f"making the {name} failed (exit {done.returncode}):\n{output}")
        else:
            print(f"  {name}: made in {time.monotonic() - started:.0f} s", flush=True)

    with ThreadPoolExecutor(lanes) as pool:  # started in order, the next as soon as a lane is free
        list(pool.map(make, missing_ones))
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(make_suite_models())
