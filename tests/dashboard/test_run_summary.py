"""First-hour N9, N11, N12, N14, N15: the dashboard's run summary (the scorecard's headline numbers), the
run's state (running, finished, stopped; `--follow` says when the run ended), the grad_norm panel's rule as
the watch judges it, resume (chunk boundary) markers, the advantage column, the final rollout's sample
table and the per-prompt eval view. API tests here; the browser checks, with a screenshot of the summary,
at the end (skipped without chromium)."""
from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
from tests.support.dashboard import RECORDED, serve
from fastapi.testclient import TestClient
from webdriver import missing_browser

from miles.dashboard.app import build_app
from miles.record.samples import samples_due
from miles.run.scorecard import scorecard

EVAL_RUN = Path(__file__).parents[1] / "compare" / "recorded" / "default-1"  # a run with samples/eval/
SHOTS = Path(os.environ.get("MILES_SCREENSHOT_DIR", Path(__file__).parents[2] / "runs" / "screenshots"))


def client(run: Path) -> TestClient:
    return TestClient(build_app(run))


def get(c: TestClient, path: str) -> dict:
    response = c.get(path)
    assert response.status_code == 200, response.text
    return response.json()


def add_resume(run: Path, rollout_id: int) -> None:
    """A `resume` span as the trainer writes it when it continues from a checkpoint (the next chunk)."""
    spans = [json.loads(line) for line in (run / "timeline.jsonl").read_text().splitlines()]
    at = min(s["start"] for s in spans if s.get("rollout_id") == rollout_id)
    with (run / "timeline.jsonl").open("a") as f:
        f.write(json.dumps({"lane": "trainer", "name": "resume", "start": at - 2.0, "end": at - 0.5,
                            "rollout_id": rollout_id, "args": {"checkpoint": "/x/iter_0000001"}}) + "\n")


def test_the_summary_holds_the_scorecards_numbers(run_copy):
    s = get(client(run_copy), "/api/summary")
    card = scorecard(run_copy)
    assert s["state"] == "finished" and (s["rollouts"], s["num_rollout"]) == (4, 4)
    assert (s["base_eval"], s["final_eval"], s["final_eval_rollout"]) == (card.base_eval, card.final_eval, 3)
    assert s["eval_key"] == "eval/arithmetic-pass_at_1" and s["base_eval"] < s["final_eval"]
    assert s["reward_first"] == [0, card.reward_first[1]] and s["reward_last"] == [3, card.reward_last[1]]
    assert s["duration_s"] == pytest.approx(card.journal_seconds) and s["duration"] == "2s"
    assert s["verdict"] == "finished: held-out eval rose (+0.031), no red flags"
    assert [name for name, _ in s["rows"]][:4] == ["held-out eval", "reward", "rollouts", "red flags"]


def test_the_run_state(run_copy):
    c = client(run_copy)
    assert get(c, "/api/run")["state"] == "finished"
    config = run_copy / "tracking" / "config.yaml"
    config.write_text(config.read_text().replace("num_rollout: 4", "num_rollout: 10"))
    assert get(c, "/api/run")["state"] == "stopped"  # rollouts left and no trainer holds the run
    (run_copy / ".lock").write_text(f"pid {os.getpid()} on {socket.gethostname()} since 2026-12-03T18:00:00\n")
    assert get(c, "/api/run")["state"] == "running"  # a live holder of the lock (the lock is only read)
    (run_copy / ".lock").write_text(f"pid 999999999 on {socket.gethostname()} since 2026-12-03T18:00:00\n")
    assert get(c, "/api/run")["state"] == "stopped"  # its holder is gone


def test_the_grad_norm_panel_states_the_watchs_rule(run_copy):
    panel = next(p for p in get(client(run_copy), "/api/watch")["panels"] if p["title"] == "grad_norm")
    grad = [json.loads(line).get("train/grad_norm") for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    at_clip = sum(v >= 1.0 for v in grad if v is not None)
    assert panel["red_flag"] == (f"at or above clip_grad=1 in every one of 20 rollouts in a row (this run: at clip "
                                 f"in {at_clip} of 4; short runs of it are normal)")


def test_resumes_are_marked_on_every_step_axis(run_copy):
    c = client(run_copy)
    assert get(c, "/api/metrics")["resumes"] == []
    add_resume(run_copy, 2)
    (resume,) = get(c, "/api/metrics")["resumes"]
    assert resume["rollout_id"] == 2 and resume["x"] == {"rollout/step": 2, "train/step": 2}
    assert get(c, "/api/watch")["resumes"] == [resume]


def test_the_last_rollout_has_a_sample_table():
    assert [r for r in range(100) if samples_due(10, r, 100)] == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 99]
    assert [r for r in range(25) if samples_due(10, r)] == [0, 10, 20]  # no run length known: the interval only
    assert not any(samples_due(None, r, 100) for r in range(100))


def test_per_prompt_evals(tmp_path):
    run = shutil.copytree(EVAL_RUN, tmp_path / "run")
    c = client(run)
    data = get(c, "/api/evals")
    assert data["steps"] == [0, 3, 7] and data["step"] == 7 and len(data["prompts"]) == 64
    rates = [r["pass_rate"] for r in data["prompts"]]
    assert rates == sorted(rates)  # the prompts it fails first
    st = data["sets"]["arithmetic"]
    assert st["prompts"] == 64 and st["never_solved"] == rates.count(0.0)
    assert st["mean_pass_rate"] == pytest.approx(sum(rates) / 64)
    assert get(c, "/api/evals?step=0")["step"] == 0
    assert c.get("/api/evals?step=5").status_code == 404
    assert get(client(RECORDED), "/api/evals")["available"] is False


# ---- in the browser ------------------------------------------------------------------------------------
browser_only = pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))


@browser_only
def test_the_summary_and_markers_in_the_browser(browser, run_copy):
    add_resume(run_copy, 2)
    served = serve(run_copy, "--follow")
    try:
        browser.open(served.url + "/#metrics")
        browser.wait_for("#run-summary")
        assert browser.text("#summary-verdict") == "finished: held-out eval rose (+0.031), no red flags"
        cells = browser.script("return [...document.querySelectorAll('.summary-cell')].map(c => "
                               "[c.dataset.key, c.querySelector('.summary-value').textContent])")
        cells = dict(cells)
        assert cells["rollouts"] == "4 of 4" and cells["state"] == "finished" and cells["training"] == "2s"
        assert cells["held-out arithmetic-pass_at_1"] == "0.188 → 0.219 (after rollout 3)"
        # the run ended: the header says so, and there is nothing more to follow
        assert browser.text("#run-state").endswith("· finished · the run ended: nothing more to follow")
        assert "4 of 4 iterations" in browser.text("#run-state")
        # a resume at rollout 2 is a dotted line in every chart on the rollout and train axes
        assert len(browser.find_all(".watch-panel line.resume-mark")) >= 7
        assert "resume" in browser.text("#resume-note")
        grad = browser.script("return [...document.querySelectorAll('.watch-panel')].find(p => "
                              "p.querySelector('h3').textContent === 'grad_norm').textContent")
        assert "in every one of 20 rollouts in a row" in grad
        browser.script("document.getElementById('run-summary').scrollIntoView()")
        browser.screenshot(SHOTS / "run-summary.png")
        browser.open(served.url + "/#timeline")
        assert len(browser.find_all("#timeline-svg line.resume-mark")) == 1
        browser.open(served.url + "/#rollouts")
        headers = browser.script("return [...document.querySelectorAll('#samples-table th')].map(h => h.textContent)")
        assert headers[:4] == ["#", "group", "reward", "advantage"]
        assert all(v not in ("", "–") for v in browser.script(
            "return [...document.querySelectorAll('#samples-table td.advantage')].map(t => t.textContent)"))
    finally:
        served.stop()


@browser_only
def test_the_evals_view(browser, tmp_path):
    run = shutil.copytree(EVAL_RUN, tmp_path / "run")
    served = serve(run)
    try:
        browser.open(served.url + "/#evals")
        rows = browser.find_all("#eval-prompts tr.eval-row")
        assert len(rows) == 64
        assert browser.text("[data-set=arithmetic]").startswith("arithmetic: 64 prompts, mean pass rate")
        browser.screenshot(SHOTS / "evals.png")
    finally:
        served.stop()
