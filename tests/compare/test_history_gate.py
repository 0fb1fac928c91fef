"""`miles doctor RUN_DIR --history DIR`: cold start is inactive and says so, a run is added as trusted only
when it passed, the records are compact, shadow mode reports and exits 0, enforce mode exits 1."""
from __future__ import annotations

import json

import pytest
from compare_helpers import copy_run, edit_journal, miles


def doctor(run, history, *flags):
    return miles("doctor", run, "--history", history, *flags)


def test_cold_start_then_corridors(tmp_path):
    history = tmp_path / "history"
    first = doctor(copy_run(tmp_path / "a"), history, "--history-add", "--history-mode", "enforce")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "cold start: 0 of 2 trusted runs, corridors inactive" in first.stdout
    assert "added to the history as trusted" in first.stdout
    record = json.loads((history / "a.json").read_text())
    assert record["format"] == "miles-trusted-run/1" and "rollout/raw_reward" in record["curves"]
    assert (history / "a.json").stat().st_size < 8000  # compact: only the judged curves
    # a shifted run in cold start: nothing to judge it against yet, so it passes, and says why
    shifted = copy_run(tmp_path / "shifted")
    edit_journal(shifted, lambda r: r["rollout_id"] >= 2 and r.update({"rollout/raw_reward": 0.0}))
    cold = doctor(shifted, history, "--history-mode", "enforce")
    assert cold.returncode == 0 and "cold start: 1 of 2" in cold.stdout
    assert doctor(copy_run(tmp_path / "b"), history, "--history-add").returncode == 0
    assert sorted(p.name for p in history.iterdir()) == ["a.json", "b.json"]
    enforced = doctor(shifted, history, "--history-mode", "enforce", "--history-add")
    assert enforced.returncode == 1 and "2 trusted runs: FAILED" in enforced.stdout
    row = next(line for line in enforced.stdout.splitlines() if line.startswith("rollout/raw_reward "))
    assert row.split()[1:3] == ["OUTSIDE", "2"]
    assert "not added to the history: the history gate did not pass" in enforced.stdout
    assert not (history / "shifted.json").exists()
    shadow = doctor(shifted, history)
    assert shadow.returncode == 0 and "would fail (shadow mode: reported only)" in shadow.stdout


def test_a_missing_value_fails_the_gate(tmp_path):
    history = tmp_path / "history"
    for name in ("a", "b"):
        assert doctor(copy_run(tmp_path / name), history, "--history-add").returncode == 0
    short = copy_run(tmp_path / "short")
    lines = (short / "metrics.jsonl").read_text().splitlines(keepends=True)
    (short / "metrics.jsonl").write_text("".join(lines[:-1]))  # the run stopped a rollout early
    done = doctor(short, history, "--history-mode", "enforce")
    assert done.returncode == 1 and "missing" in done.stdout
    nan = copy_run(tmp_path / "nan")
    edit_journal(nan, lambda r: r["rollout_id"] == 1 and r.update({"train/grad_norm": float("nan")}))
    done = doctor(nan, history, "--history-mode", "enforce")
    assert done.returncode == 1 and "not finite" in done.stdout


def test_the_history_rules_file_and_bad_histories(tmp_path):
    history = tmp_path / "history"
    history.mkdir()
    (history / "rules.json").write_text(json.dumps({"rules": [
        {"pattern": "rollout/raw_reward", "worse": "down", "rel": 0.2, "abs": 0.05, "min": 0.3}]}))
    done = doctor(copy_run(tmp_path / "a"), history, "--history-mode", "enforce")
    # cold start, but the absolute bound needs no history: rollout 3's reward is 0.25 < 0.3
    assert done.returncode == 1 and "below the absolute bound 0.3" in done.stdout
    (history / "broken.json").write_text("{not json")
    done = doctor(copy_run(tmp_path / "b"), history)
    assert done.returncode == 3 and "broken.json" in done.stderr and "Traceback" not in done.stderr
    (history / "broken.json").unlink()
    (history / "rules.json").write_text('{"rules": []}')
    done = doctor(copy_run(tmp_path / "c"), history)
    assert done.returncode == 2 and "rules.json" in done.stderr


@pytest.mark.parametrize("flags,message", [
    (["--history-add"], "need --history DIR"),
    (["--history", "H", "--history-min-runs", "0"], "--history-min-runs: 0"),
    (["--history", "H", "--history-mode", "loud"], "invalid choice"),
])
def test_history_flags_are_checked(tmp_path, flags, message):
    run = copy_run(tmp_path / "a")
    done = miles("doctor", run, *[str(tmp_path / f) if f == "H" else f for f in flags])
    assert done.returncode == 2 and message in done.stderr


def test_a_history_that_is_not_a_directory_of_records_is_refused(tmp_path):
    """A mistyped DIR or a URI would be an empty history: a cold start that passes any run in enforce mode."""
    run = copy_run(tmp_path / "a")
    missing = doctor(run, tmp_path / "typo", "--history-mode", "enforce")
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    uri = doctor(run, "http://127.0.0.1:5000", "--history-mode", "enforce")
    assert uri.returncode == 2 and "is a URI" in uri.stderr
    made = doctor(run, tmp_path / "new", "--history-add")  # the first add makes the directory
    assert made.returncode == 0 and (tmp_path / "new" / "a.json").is_file()
