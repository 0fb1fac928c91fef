"""benchmarks/pretrained.py's parts: the kernel's peak-RSS mark of a process, the role read from a command
line, the peaks of a real child's process tree, and the learning figures read from a recorded run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.pretrained import better_role, learning, peak_rss_mb, role, watch  # noqa: E402


def test_peak_rss_is_the_high_water_mark():
    """A fresh child (this process's mark may already be far above its current size) allocates 64 MB and
    frees it: its mark rises by that much and stays up after the free."""
    code = ("import sys\nsys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.readline()\n"
            "b = bytearray(64 * 2**20); b[::4096] = b'x' * len(b[::4096]); del b\n"
            "sys.stdout.write('freed\\n'); sys.stdout.flush(); sys.stdin.readline()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        before = peak_rss_mb(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "freed\n"
        after = peak_rss_mb(child.pid)
        assert before is not None and after >= before + 60  # freed already: a mark, not the current size
        child.stdin.write("end\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert peak_rss_mb(child.pid) is None  # gone


@pytest.mark.parametrize("cmdline,expected", [
    (["ray::FSDPTrainActor.train"], "ray actor FSDPTrainActor"),
    (["/v/bin/python", "-m", "miles.engines.cli", "--port", "1"], "miles.engines.cli"),
    (["/v/bin/python", "-m", "miles.train", "--config", "c.yaml"], "driver (python -m miles.train)"),
    (["/v/lib/ray/core/src/ray/gcs/gcs_server", "--x"], "ray gcs_server"),
    (["/v/bin/python", "/v/ray/_private/workers/default_worker.py", "--raylet-name=/tmp/raylet"], "ray default_worker"),
])
def test_role_names_the_process(cmdline, expected):
    assert role(cmdline) == expected


@pytest.mark.parametrize("known,seen,kept", [
    ("?", "python", "python"),  # first read in the moment after exec, with no arguments yet
    ("python", "?", "python"),
    ("ray default_worker", "ray actor FSDPTrainActor", "ray actor FSDPTrainActor"),
    ("ray actor FSDPTrainActor", "ray default_worker", "ray actor FSDPTrainActor"),
    ("miles.engines.cli", "?", "miles.engines.cli"),
])
def test_a_generic_or_empty_name_is_replaced_by_a_later_look(known, seen, kept):
    assert better_role(known, seen) == kept


def test_watch_reads_every_process_of_the_tree():
    code = "import subprocess, sys; b = bytearray(48 * 2**20); b[::4096] = b'x' * len(b[::4096]); " \
           "subprocess.run([sys.executable, '-m', 'this'], stdout=subprocess.DEVNULL); import time; time.sleep(1)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    peaks = watch(proc, poll=0.05)
    assert proc.wait() == 0
    assert proc.pid in peaks and peaks[proc.pid]["peak_mb"] >= 48
    assert peaks[proc.pid]["role"] == "python"


def test_learning_figures_come_from_the_journal():
    figures = learning(ROOT / "tests" / "compare" / "recorded" / "default-1")
    assert figures["eval_key"] == "eval/arithmetic-pass_at_1"
    assert figures["pass_at_1_before"] < figures["pass_at_1_after"] and figures["after_rollout"] == 7
    assert [r for r, _ in figures["evals"]] == [3, 7] and figures["rollouts"] == 8
    assert 0 <= figures["logprob_diff_rollout0"] < 1e-3
