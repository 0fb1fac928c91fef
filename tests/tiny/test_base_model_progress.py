"""`miles base-model` on a first start says what it is doing before the warm start (it printed nothing for
18 s, its first line was the step-250 check), prints progress between the checks off a terminal, names a
warm start another process is running, and adds no "Writing model shards" bar to the output."""
from __future__ import annotations

import fcntl
import json
import threading

import pytest

from miles.tiny import cli, recipes, warmstart
from miles.tiny.progress import ProgressLines


@pytest.fixture
def fake_warm_start(tmp_path, monkeypatch, capsys):
    """An empty cache and a warm start that records what was printed before it began."""
    monkeypatch.setattr(warmstart, "cache_root", lambda: tmp_path)  # the lock
    monkeypatch.setattr(recipes, "cache_root", lambda: tmp_path)  # the model's directory
    seen = {}

    def make(out_dir, progress=True):
        seen["printed_before"] = capsys.readouterr().out
        out_dir.mkdir(parents=True)
        return dict(recipe={}, steps=250, eval_greedy_accuracy=0.96, eval_pass_at_1=0.5, seconds=1.0)

    monkeypatch.setattr(warmstart, "warm_start", make)
    monkeypatch.setattr(warmstart, "default_task_data", lambda: None)
    return seen


def test_the_first_line_comes_before_the_warm_start(fake_warm_start, tmp_path, capsys):
    assert cli.main(["--quiet"]) == 0
    before = fake_warm_start["printed_before"]
    assert before.startswith("making the tiny base model (first start on this machine only")
    assert str(warmstart.base_model_dir()) in before
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("base model (made in 1.0s)") and out[-1] == str(warmstart.base_model_dir())
    assert cli.main(["--quiet"]) == 0  # cached: no "making" line
    assert "making" not in capsys.readouterr().out


def test_a_warm_start_in_another_process_is_named_while_waiting(fake_warm_start, tmp_path, capsys):
    lock = tmp_path / f".{warmstart.base_model_dir().name}.lock"
    held = open(lock, "w")
    fcntl.flock(held, fcntl.LOCK_EX)  # another maker (a flock on another open file blocks this process too)
    release = threading.Timer(0.5, lambda: fcntl.flock(held, fcntl.LOCK_UN))
    release.start()
    try:
        path = warmstart.ensure_base_model(progress=True)
    finally:
        release.join()
        held.close()
    assert "another process is making" in fake_warm_start["printed_before"]
    assert json.loads((path / "warmstart.json").read_text())["steps"] == 250


def test_progress_lines_between_checks_are_timed():
    now = [0.0]
    lines, out = [], type("Out", (), {"write": lambda self, s: lines.append(s), "flush": lambda self: None})()
    progress = ProgressLines("warm start", 8000, enabled=True, every_s=5.0, clock=lambda: now[0], out=out)
    assert not progress.tick(1, 2.0)  # not due yet
    now[0] = 5.0
    assert progress.tick(60, 1.5)
    assert "".join(lines).startswith("[tiny] warm start step 60/8000, loss 1.500, 5s")
    now[0] = 7.0
    progress.say("check")  # a check's line restarts the interval
    now[0] = 11.0
    assert not progress.tick(100, 1.0)
    assert not ProgressLines("x", 1, enabled=False).tick(1, 1.0)


def test_saving_prints_no_shard_bar(tmp_path, capfd, base_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    model = AutoModelForCausalLM.from_pretrained(base_model)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    capfd.readouterr()
    warmstart.save_checkpoint(model, tokenizer, tmp_path / "out")
    captured = capfd.readouterr()
    assert "Writing model shards" not in captured.out + captured.err
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert hf_logging.is_progress_bar_enabled()  # restored for everyone else
