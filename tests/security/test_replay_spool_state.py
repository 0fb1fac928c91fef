"""Probes DD1/DD2: `miles replay-spool` on corrupted tracking state, odd journal values, and a trainer.json
that names files outside the run dir.

Corrupt state is one line and exit 2 (never a traceback); a cursor past the journal's end is refused
(lines recorded later would count as delivered); a journal value that is not a number does not keep a
tracker's spool blocked; only files inside the run dir are uploaded.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from miles.tracking.state import DeliveryState

from tests.tracking.tracking_helpers import run_synthetic

from .spooled_runs import TRACKERS, edit_delivery, replay_spool


def _set(field, value):
    def change(state):
        for sink in state["sinks"].values():
            sink[field] = value
    return change


def _with_option(text: str, key: str, option: str, value) -> str:
    state = json.loads(text)
    spec = state[key]["tensorboard"]["spec"] if key == "sinks" else state[key]["tensorboard"]
    spec["options"][option] = value
    return json.dumps(state)


def _without_option(text: str, option: str) -> str:
    state = json.loads(text)
    state["sinks"]["tensorboard"]["spec"]["options"].pop(option)
    return json.dumps(state)


CORRUPT = {
    "delivery.json empty": ("delivery.json", lambda text: ""),
    "delivery.json truncated": ("delivery.json", lambda text: text[: len(text) // 2]),
    "delivery.json binary": ("delivery.json", lambda text: "\udcff\udcfe"),
    "delivery.json a list": ("delivery.json", lambda text: "[1, 2]"),
    "sinks a list": ("delivery.json", lambda text: '{"sinks": [1]}'),
    "a sink without spec": ("delivery.json", lambda text: '{"sinks": {"mlflow": {"cursor": 1}}}'),
    "trainer.json truncated": ("trainer.json", lambda text: text[: len(text) // 2]),
    "trainer.json artifacts a string": ("trainer.json", lambda text: json.dumps({**json.loads(text),
                                                                                 "artifacts": "/etc/passwd"})),
    "a tracker spec with an extra key": ("trainer.json", lambda text: json.dumps({**json.loads(text), "trackers": {
        "mlflow": {"kind": "mlflow", "options": {}, "extra": 1}}})),
    "an unknown option in a delivered spec": ("delivery.json", lambda text: _with_option(text, "sinks", "zz", 1)),
    "a missing option in a delivered spec": ("delivery.json", lambda text: _without_option(text, "log_dir")),
    "an option of the wrong type": ("delivery.json", lambda text: _with_option(text, "sinks", "log_dir", 5)),
    "a config setting name that is not a string": ("config.yaml", lambda text: text + "1: 2\n"),
}


@pytest.mark.parametrize("name,corrupt", CORRUPT.values(), ids=CORRUPT.keys())
def test_corrupt_state_is_one_line_and_exit_2(run_copy, name, corrupt):
    path = run_copy / "tracking" / name
    path.write_bytes(corrupt(path.read_text()).encode("utf-8", "surrogateescape"))
    done = replay_spool(run_copy)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("miles replay-spool: error:") and name in line


@pytest.mark.parametrize("cursor", ["3", -5, 1.5, None, True])
def test_a_cursor_of_the_wrong_kind_is_refused(run_copy, cursor):
    edit_delivery(run_copy, _set("cursor", cursor))
    done = replay_spool(run_copy)
    assert done.returncode == 2 and "cursor" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_cursor_past_the_journal_end_is_refused(run_copy):
    edit_delivery(run_copy, _set("cursor", 10**9))
    done = replay_spool(run_copy)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "1000000000" in done.stderr and "the journal has 3" in done.stderr


def test_a_journal_line_with_a_bad_rollout_id_does_not_stop_delivery(run_copy):
    with (run_copy / "metrics.jsonl").open("a") as f:
        f.write('{"rollout_id": "x", "time": 9.0, "train/loss": 1.0}\n')
    done = replay_spool(run_copy)
    assert done.returncode == 0 and "holds all 3 journal lines" in done.stdout, done.stdout + done.stderr


def test_a_string_value_does_not_block_a_tracker(finished_run, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_synthetic(run_dir, "--rollouts", "3", *TRACKERS)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"rollout_id": 3, "time": 9.0, "train/loss": "high", "rollout/step": 3.0,
                            "train/grad_norm": 0.5}) + "\n")
    for _ in range(2):  # delivered, then nothing left on the second replay
        done = replay_spool(run_dir)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "holds all 4 journal lines" in done.stdout
    assert {s.cursor for s in DeliveryState.load(run_dir).sinks.values()} == {4}


def test_only_files_inside_the_run_dir_are_uploaded(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_synthetic(run_dir, "--rollouts", "2", *TRACKERS)
    secret = tmp_path / "outside-secret.txt"
    secret.write_text("probe-outside-secret-7731\n")
    (run_dir / "link-out").symlink_to(secret)
    trainer_path = run_dir / "tracking" / "trainer.json"
    trainer = json.loads(trainer_path.read_text())
    trainer["artifacts"] += [str(secret), str(run_dir / "link-out"), str(run_dir / ".." / secret.name)]
    trainer_path.write_text(json.dumps(trainer))
    edit_delivery(run_dir, _set("uploaded", False))  # so the replay uploads again
    done = replay_spool(run_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("outside the run dir") == 1, done.stderr  # one line names the 3 files
    assert "not uploading 3 file(s)" in done.stderr, done.stderr
    uploaded = [p for p in (run_dir.parent / "mlartifacts").rglob("*") if p.is_file()]  # the shared store's
    assert any(p.name == "metrics.jsonl" for p in uploaded)  # the run's own artifacts still go up
    assert not any(p.name in ("outside-secret.txt", "link-out") for p in uploaded)
    assert all(b"probe-outside-secret-7731" not in p.read_bytes() for p in uploaded)


@pytest.mark.parametrize("state_file", ["delivery.json", "trainer.json"])
def test_tracker_writes_outside_the_run_dir_are_refused(run_copy, tmp_path, state_file):
    """DD2: a log_dir elsewhere in either state file: one line, exit 2, nothing written there; the run's
    owner lets it through with --allow-dir."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = run_copy / "tracking" / state_file
    state = json.loads(path.read_text())
    if state_file == "delivery.json":
        state["sinks"]["tensorboard"]["spec"]["options"]["log_dir"] = str(elsewhere / "tb")
        # so the replay has lines to write (TensorBoard's only: the copy's mlflow.db still gives the original
        # run's artifact location, outside this copy, which the replay now refuses: probe N45)
        state["sinks"]["tensorboard"]["cursor"] = 0
    else:
        state["trackers"]["tensorboard"]["options"]["log_dir"] = str(elsewhere / "tb")
        edit_delivery(run_copy, lambda d: d["sinks"].pop("tensorboard"))  # never opened: the trainer's spec
    path.write_text(json.dumps(state))
    done = replay_spool(run_copy)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "log_dir" in line and "outside the run dir" in line and state_file in line, line
    assert list(elsewhere.iterdir()) == []
    done = replay_spool(run_copy, "--allow-dir", str(elsewhere))
    assert done.returncode == 0, done.stdout + done.stderr
    assert list((elsewhere / "tb").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("option,value", [("artifact_dir", "{elsewhere}/art"),
                                          ("tracking_uri", "sqlite:///{elsewhere}/other.db")])
def test_mlflow_writes_outside_the_run_dir_are_refused(run_copy, tmp_path, option, value):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    edit_delivery(run_copy, lambda d: d["sinks"]["mlflow"]["spec"]["options"].update(
        {option: value.format(elsewhere=elsewhere)}) or d["sinks"]["mlflow"].update(uploaded=False))
    done = replay_spool(run_copy)
    assert done.returncode == 2 and option in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_copied_run_dir_names_its_own_files_and_replays_without_warnings(finished_run, tmp_path):
    """First-hour N19: trainer.json named each artifact by its absolute path, so a copy of the run dir
    warned "outside the run dir" for each of them on every replay; the names are relative now."""
    trainer = json.loads((finished_run / "tracking" / "trainer.json").read_text())
    assert trainer["artifacts"] and not any(Path(a).is_absolute() for a in trainer["artifacts"])
    copy = tmp_path / "elsewhere" / "run"
    shutil.copytree(finished_run, copy)
    edit_delivery(copy, _set("uploaded", False))  # so the replay uploads again, from the copy
    done = replay_spool(copy, "--allow-dir", str(finished_run.parent))  # its trackers still write where they did
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outside the run dir" not in done.stderr, done.stderr
