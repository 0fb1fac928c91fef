"""Probes N30, N31, N33, N36, N37 and A5 (round 3): what `miles compare`, `miles doctor --history` and the
dashboard trusted in the files they read.

An empty baseline is nothing to compare against (exit 3, not "every signal within"); baselines near the
float limit give a corridor that is not finite, an error and never a pass, and `--json` stays strict JSON;
`--history-add` never writes through a planted symlink; a 401-digit number is an unreadable record (exit
3, not a traceback with the red-flag code 1) and a dropped value in the dashboard (never a 500); control
characters in keys and run dir names never reach the terminal.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from miles.dashboard.app import build_app

from tests.compare.compare_helpers import copy_run, miles
from tests.support.dashboard import RECORDED

ESC = "\x1b"


def rewrite(run: Path, change) -> None:
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(change(r) or r) + "\n" for r in rows))


def strict(text: str):
    """json.loads refusing NaN and Infinity, as browsers, jq and Go do."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in the JSON"))


@pytest.mark.parametrize("journal", [b"garbage\n", b"", bytes(range(256)) * 8,
                                     b'{"rollout_id": 0, "time": 1.0}\n{"rollout_id": 1, "time": 2.0, "x/y": 1}\n'],
                         ids=["garbage", "empty", "binary", "no-compared-metric"])
def test_an_empty_baseline_is_refused(tmp_path, journal):
    """N30: before, every signal was "no baseline", the verdict within, exit 0: a CI gate passed any run."""
    run = copy_run(tmp_path / "run")
    empty = tmp_path / "B"
    empty.mkdir()
    (empty / "metrics.jsonl").write_bytes(journal)
    done = miles("compare", run, empty)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "nothing to compare against" in done.stderr and str(empty) in done.stderr
    assert "Traceback" not in done.stderr and "within" not in done.stdout


def test_an_empty_trusted_record_is_refused(tmp_path):
    history = tmp_path / "h"
    history.mkdir()
    for name in ("a", "b"):
        (history / f"{name}.json").write_text(json.dumps({"format": "miles-trusted-run/1", "run": name,
                                                          "source": "/x", "reached": {}, "curves": {}}))
    done = miles("doctor", copy_run(tmp_path / "run"), "--history", history)
    assert done.returncode == 3 and "nothing to compare against" in done.stderr, done.stdout + done.stderr
    assert "passed" not in done.stdout


def with_grad_norm(run: Path, value: float) -> Path:
    rewrite(run, lambda d: d["rollout_id"] >= 0 and d.update({"train/grad_norm": value}))
    return run


def test_baselines_at_the_float_limit_give_an_honest_corridor_and_strict_json(tmp_path):
    """N31: two baselines' grad_norm at 1e308 summed to inf, so the mean and the bound were inf and a run at
    1.7e308 was within; `--json` printed bare Infinity. The mean is now computed on scaled values (1e308)
    and the run is outside; where the corridor itself is past the float limit (baselines at +-1.7e308: the
    spread overflows) the signal is an error, never a pass."""
    run = with_grad_norm(copy_run(tmp_path / "run"), 1.7e308)
    baselines = [with_grad_norm(copy_run(tmp_path / name), 1e308) for name in ("H1", "H2")]
    done = miles("compare", run, *baselines, "--json")
    assert done.returncode == 1, done.stderr
    report = strict(done.stdout)
    grad = next(s for s in report["signals"] if s["key"] == "train/grad_norm")
    assert grad["verdict"] == "outside" and grad["points"][0]["mean"] == pytest.approx(1e308)
    assert grad["points"][0]["bound"] == pytest.approx(1.5e308)
    spread = [with_grad_norm(copy_run(tmp_path / name), value) for name, value in (("P", 1.7e308), ("M", -1.7e308))]
    done = miles("compare", copy_run(tmp_path / "plain"), *spread, "--json")
    assert done.returncode == 1, done.stderr
    grad = next(s for s in strict(done.stdout)["signals"] if s["key"] == "train/grad_norm")
    assert grad["verdict"] == "error" and "corridor is not finite" in grad["why"]
    assert all(p["bound"] is None for p in grad["points"])  # null in strict JSON, named by `why`
    table = miles("compare", copy_run(tmp_path / "plain2"), *spread)
    assert table.returncode == 1 and "regressions: train/grad_norm" in table.stdout


def test_the_history_gate_fails_a_run_past_records_at_the_float_limit(tmp_path):
    history = tmp_path / "hist"
    history.mkdir()
    steps = [json.loads(line)["rollout_id"] for line in (RECORDED / "metrics.jsonl").read_text().splitlines()]
    for name in ("a", "b"):
        (history / f"{name}.json").write_text(json.dumps({
            "format": "miles-trusted-run/1", "run": name, "source": f"/{name}", "reached": {"train/step": max(steps)},
            "curves": {"train/grad_norm": [[s, 1e308] for s in steps if s >= 0]}}))
    run = with_grad_norm(copy_run(tmp_path / "run"), 1.7e308)
    done = miles("doctor", run, "--history", history, "--history-mode", "enforce")
    assert done.returncode == 1 and "FAILED" in done.stdout, done.stdout + done.stderr
    assert "train/grad_norm" in done.stdout and "Infinity" not in done.stdout


def test_a_401_digit_record_value_is_unreadable_not_a_traceback(tmp_path):
    """N36: OverflowError traceback, exit 1 (the red-flag code)."""
    history = tmp_path / "hist"
    history.mkdir()
    (history / "a.json").write_text('{"format":"miles-trusted-run/1","run":"x","source":"/x","reached":{},'
                                    '"curves":{"train/grad_norm":[[1, 1' + "0" * 400 + "]]}}")
    done = miles("doctor", copy_run(tmp_path / "run"), "--history", history)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "a.json" in done.stderr and "train/grad_norm" in done.stderr and "Traceback" not in done.stderr


def test_history_add_never_writes_through_a_planted_symlink(tmp_path):
    """N37: the outside file was overwritten with the record, and `<run>.json` became that symlink."""
    run = copy_run(tmp_path / "run")
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    history = tmp_path / "h"
    history.mkdir()
    (history / "run.tmp").symlink_to(victim)
    done = miles("doctor", run, "--history", history, "--history-add")
    assert done.returncode == 0 and "added to the history as trusted" in done.stdout, done.stdout + done.stderr
    assert victim.read_text() == "keep\n"
    record = history / "run.json"
    assert not record.is_symlink() and json.loads(record.read_text())["run"] == "run"
    # a record that is itself a link to a file outside is refused when the history is read
    other = tmp_path / "other"
    other.mkdir()
    (other / "outside.json").write_text(record.read_text())
    (history / "planted.json").symlink_to(other / "outside.json")
    done = miles("doctor", run, "--history", history)
    assert done.returncode == 3 and "symbolic link" in done.stderr and "planted.json" in done.stderr


def test_control_characters_never_reach_the_terminal(tmp_path):
    """N33: a key `perf/\\e[2J\\e[31mPWNED\\e]0;title\\a_time` and a dir named with `\\e[41m` cleared, coloured
    and retitled the terminal."""
    run = copy_run(tmp_path / "run")
    base = copy_run(tmp_path / f"base{ESC}[41mred")
    key = f"perf/{ESC}[2J{ESC}[31mPWNED{ESC}]0;title\a_time"
    for r in (run, base):
        rewrite(r, lambda d: d["rollout_id"] >= 0 and d.update({key: 1.0}))
    done = miles("compare", run, base)
    assert done.returncode in (0, 1), done.stderr
    assert ESC not in done.stdout and "\a" not in done.stdout
    assert "\\x1b[2J" in done.stdout and "\\x1b[41mred" in done.stdout  # shown, escaped
    doctor = miles("doctor", base)
    assert ESC not in doctor.stdout


@pytest.mark.parametrize("line", [
    '{"rollout_id": 4, "time": 9.0, "train/loss": 1' + "0" * 400 + "}",
    '{"rollout_id": 4, "time": 9.0, "rollout/raw_reward": -' + "9" * 401 + "}",
], ids=["401-digit", "401-digit-negative"])
def test_the_dashboard_drops_a_401_digit_metric_and_shows_the_rest(tmp_path, line):
    """A5: OverflowError in run_files; /api/run, /api/metrics, /api/watch and /api/health answered 500 and,
    as every view calls /api/run first, the page showed nothing."""
    run = copy_run(tmp_path / "run")
    with (run / "metrics.jsonl").open("a") as f:
        f.write(line + "\n")
    client = TestClient(build_app(run))
    for path in ("/api/run", "/api/metrics", "/api/watch", "/api/health", "/api/compare"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:300])
    summary = client.get("/api/run").json()
    assert summary["iterations"] == 5  # the odd line's rollout counted; its huge value is no point
    series = client.get("/api/metrics").json()["series"]
    assert len(series["rollout/raw_reward"]["y"]) == 4 or len(series["train/loss"]["y"]) == 4


def test_a_span_at_the_float_limit_is_skipped_not_a_500(tmp_path):
    run = copy_run(tmp_path / "run")
    with (run / "timeline.jsonl").open("a") as f:
        f.write(json.dumps({"lane": "trainer", "name": "train", "start": 1.0, "end": 1e308, "rollout_id": 1}) + "\n")
    client = TestClient(build_app(run))
    for path in ("/api/timeline", "/api/timeline/chrome"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:300])
    assert "Infinity" not in client.get("/api/timeline/chrome").text


def test_the_dashboard_refuses_an_empty_baseline(tmp_path):
    """N30 in the Compare view: a listed sibling with no compared metric is a 400 naming it, not "within"."""
    run = copy_run(tmp_path / "runs" / "run")
    empty = tmp_path / "runs" / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("garbage\n")
    c = TestClient(build_app(run))
    response = c.get("/api/compare", params={"baseline": str(empty)})
    assert response.status_code == 400 and "nothing to compare against" in response.json()["detail"]
