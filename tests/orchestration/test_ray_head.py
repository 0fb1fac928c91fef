"""The launch-path tests' own `ray start` (ray_head.py) starts a head or a node afresh when `ray start` gives up:
Ray waits a fixed 30 s for its raylet to register, which a loaded 2-core CI machine once overran (every test
of test_launch_paths.py then errored at setup). No Ray is started here: the attempts are stand-ins."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.orchestration import ray_head
from tests.orchestration.ray_head import RayHead, RayNode


def test_a_head_that_gives_up_is_started_afresh(monkeypatch):
    started = RayHead(root=Path("/nonexistent"), token_path=Path("/nonexistent/token"), port=1, dashboard_port=2)
    answers = iter([(None, "The current node timed out during startup."), (started, "")])
    calls = []

    def attempt(num_cpus, deadline):
        calls.append(num_cpus)
        return next(answers)

    monkeypatch.setattr(ray_head, "_try_head", attempt)
    assert ray_head.start_head(num_cpus=1) is started
    assert calls == [1, 1]


def test_a_head_that_never_comes_up_is_reported_with_its_log_after_the_last_attempt(monkeypatch):
    calls = []

    def attempt(num_cpus, deadline):
        calls.append(deadline)
        return None, f"timed out during startup ({len(calls)})"

    monkeypatch.setattr(ray_head, "_try_head", attempt)
    with pytest.raises(RuntimeError, match=rf"did not come up \({ray_head.START_ATTEMPTS} attempt\(s\)\):\n"
                                           rf"timed out during startup \({ray_head.START_ATTEMPTS}\)"):
        ray_head.start_head(num_cpus=1)
    assert len(calls) == ray_head.START_ATTEMPTS and len(set(calls)) == 1  # one deadline for all attempts


def test_a_node_that_gives_up_is_started_again_and_the_dead_one_forgotten(monkeypatch, tmp_path):
    head = RayHead(root=tmp_path, token_path=tmp_path / "token", port=1, dashboard_port=2)
    alive = [1]  # the head; the second attempt's node joins
    monkeypatch.setattr(RayHead, "alive_nodes", lambda self: alive[0])

    def start_node(self, num_cpus, share_temp_dir):
        log = tmp_path / f"node{len(self.nodes)}.log"
        attempt = sum(1 for _ in tmp_path.glob("node*.log"))
        log.write_text(f"attempt {attempt}: timed out during startup")
        if attempt == 0:  # gives up at once, as `ray start` does after its 30 s
            process = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
            process.wait()
        else:
            process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
            alive[0] = 2
        self.nodes.append(RayNode(process, log))
        return self.nodes[-1]

    monkeypatch.setattr(RayHead, "_start_node", start_node)
    head.join_node(num_cpus=1)
    try:
        assert len(head.nodes) == 1 and head.nodes[0].process.poll() is None  # the dead attempt is not kept
    finally:
        head.nodes[0].stop()
