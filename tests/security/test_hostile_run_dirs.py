"""Probe CD1: `miles doctor` on hostile run directories.

Odd-typed journal lines are skipped like unparsable ones (every reader of the journal skips the same
lines); a run dir whose files cannot be read at all exits 3 with one line, never a traceback and never
1 (the code for a red flag); a FIFO in place of the journal is refused without being opened.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from miles.health.cli import EXIT_RED_FLAG, EXIT_UNREADABLE, main as doctor

GOOD = '{"rollout_id": 0, "time": 1.0, "train/loss": 0.5}'

ODD_LINES = {
    "rollout_id a string": '{"rollout_id": "x", "time": 1.0, "train/loss": 1.0}',
    "rollout_id null": '{"rollout_id": null, "time": 1.0}',
    "rollout_id a list": '{"rollout_id": [2], "time": 1.0}',
    "rollout_id 1e400": '{"rollout_id": 1e400, "time": 1.0}',
    "rollout_id true": '{"rollout_id": true, "time": 1.0}',
    "time a string": '{"rollout_id": 1, "time": "abc"}',
    "time NaN": '{"rollout_id": 1, "time": NaN}',
    "a list": "[1, 2, 3]",
    "an int": "5",
    "a string": '"line"',
    "string metric": '{"rollout_id": 1, "time": 1.0, "train/loss": "high"}',
    "list metric": '{"rollout_id": 1, "time": 1.0, "train/loss": [1]}',
    "object metric": '{"rollout_id": 1, "time": 1.0, "train/loss": {"a": 1}}',
    "int too large": '{"rollout_id": 1, "time": 1.0, "train/loss": ' + "9" * 400 + "}",
    "deep nesting": '{"rollout_id": 1, "time": 1.0, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "truncated": '{"rollout_id": 1, "ti',
    "garbage": "not json at all",
}

UNREADABLE_CONFIGS = {
    "a list": "- a\n- b\n",
    "bad YAML": "key: [unclosed\n",
    "a python tag": "x: !!python/object/apply:os.system ['echo pwned']\n",
    "clip_grad abc": "clip_grad: abc\n",
    "rollout_batch_size lots": "rollout_batch_size: lots\n",
    "a health flag of the wrong type": "health_loss_window: [1]\n",
    "an int key": "1: 2\n",
    "a null key": "~: 2\n",
    "a bool key beside good ones": "clip_grad: 1.0\ntrue: 1\n",
}


def run_dir(tmp_path, journal: bytes | str, config: bytes | str | None = None):
    (tmp_path / "tracking").mkdir(parents=True, exist_ok=True)
    (tmp_path / "metrics.jsonl").write_bytes(journal.encode() if isinstance(journal, str) else journal)
    if config is not None:
        (tmp_path / "tracking" / "config.yaml").write_bytes(config.encode() if isinstance(config, str) else config)
    return tmp_path


@pytest.mark.parametrize("line", ODD_LINES.values(), ids=ODD_LINES.keys())
def test_an_odd_journal_line_is_skipped_not_a_traceback(tmp_path, capsys, line):
    target = run_dir(tmp_path, f"{GOOD}\n{line}\n")
    assert doctor([str(target)]) == 0
    out = capsys.readouterr().out
    # the good line is read whatever its neighbour, and a line with a bad metric keeps its other keys
    assert "1 rollouts" in out or "2 rollouts" in out, out


def test_a_string_metric_is_dropped_and_the_rest_of_its_line_kept(tmp_path, capsys):
    target = run_dir(tmp_path, f'{GOOD}\n{{"rollout_id": 1, "time": 2.0, "train/loss": "high", "x": 1}}\n')
    assert doctor([str(target)]) == 0
    assert "2 rollouts" in capsys.readouterr().out


def test_nan_and_infinity_are_red_flags(tmp_path, capsys):
    lines = [GOOD] + [json.dumps({"rollout_id": i, "time": float(i), "train/loss": float("nan"),
                                  "train/grad_norm": float("inf")}) for i in range(1, 4)]
    assert doctor([str(run_dir(tmp_path, "\n".join(lines) + "\n"))]) == EXIT_RED_FLAG
    assert "red flags:" in capsys.readouterr().out


def test_a_binary_journal_reads_as_no_lines(tmp_path, capsys):
    assert doctor([str(run_dir(tmp_path, bytes(range(256)) * 64))]) == 0
    assert "0 rollouts" in capsys.readouterr().out


@pytest.mark.parametrize("config", UNREADABLE_CONFIGS.values(), ids=UNREADABLE_CONFIGS.keys())
def test_an_unreadable_config_exits_3_with_one_line(tmp_path, capsys, config):
    assert doctor([str(run_dir(tmp_path, GOOD + "\n", config))]) == EXIT_UNREADABLE
    err = capsys.readouterr().err.strip()
    assert err.startswith("miles doctor: cannot read the run") and "\n" not in err


def test_a_config_that_is_not_utf8_exits_3(tmp_path, capsys):
    assert doctor([str(run_dir(tmp_path, GOOD + "\n", b"clip_grad: \xff\xfe\n"))]) == EXIT_UNREADABLE
    assert "UTF-8" in capsys.readouterr().err


def test_a_journal_that_is_a_directory_exits_3(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").mkdir()
    assert doctor([str(tmp_path)]) == EXIT_UNREADABLE
    assert "not a regular file" in capsys.readouterr().err


def test_a_fifo_journal_exits_3_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "metrics.jsonl")
    # its own process: were the FIFO opened, the doctor would block there (timeout: the test fails, not hangs)
    command = "import sys; from miles.health.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", command, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == EXIT_UNREADABLE, done.stderr
    assert "Traceback" not in done.stderr and "not a regular file" in done.stderr
