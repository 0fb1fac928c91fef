"""Probe D2: the engine and the router die with the trainer that started them, even after SIGKILL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
TRAINER = """
import json, sys, time
from pathlib import Path
from miles.config import parse_config
from miles.prepare import prepare_config
from miles.cluster.local import start_inference

services = start_inference(prepare_config(parse_config(["--run-dir", sys.argv[1]])))
print(json.dumps([services.rollout_url, *services.engine_urls]), flush=True)
time.sleep(600)
"""


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # exited, waiting for a reaper that may never come in a container


@pytest.mark.slow
def test_engine_and_router_die_after_their_trainer_is_killed(tmp_path):
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                               cwd=ROOT, env={**os.environ, "WANDB_API_KEY": "probe-secret-key"})
    children: list[int] = []
    try:
        urls = json.loads(trainer.stdout.readline())
        children = children_of(trainer.pid)
        assert len(children) == 2 and len(urls) == 2  # the router and one engine
        for pid in children:  # S3: a service gets no secret it does not need
            assert b"probe-secret-key" not in Path(f"/proc/{pid}/environ").read_bytes()
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        wait_for(lambda: all(gone(pid) for pid in children), 30, "the orphaned engine and router to exit")
    finally:
        if trainer.poll() is None:
            trainer.kill()
        for pid in children:  # only if the test failed: never leave them behind
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
