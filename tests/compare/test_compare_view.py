"""The dashboard's Compare view, over the API and in a real headless Chromium: the baselines to choose
from (`--baseline` dirs and sibling run dirs), the same verdicts as `miles compare --json`, the run's
and the baselines' curves on one step axis with the corridor, and the per-prompt eval diff."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from compare_helpers import compare_json, copy_run, edit_journal, serve

SHOTS = Path(os.environ.get("MILES_SCREENSHOT_DIR", Path(__file__).parents[2] / "runs" / "screenshots"))


@pytest.fixture
def served(tmp_path):
    """A run with a grad_norm spike at rollout 3 and a slower rollout from 1, a baseline given with
    --baseline, and a sibling run dir beside them."""
    base = copy_run(tmp_path / "runs" / "base")
    copy_run(tmp_path / "runs" / "sibling")
    run = copy_run(tmp_path / "runs" / "run")
    edit_journal(run, lambda r: (r["rollout_id"] == 3 and r.update({"train/grad_norm": r["train/grad_norm"] * 3}),
                                 r["rollout_id"] >= 1 and r.update({"perf/rollout_time": r["perf/rollout_time"] + 5})))
    s = serve(run, "--baseline", str(base))
    try:
        yield s, run, base, tmp_path / "runs" / "sibling"
    finally:
        s.stop()


def test_api_lists_baselines_and_agrees_with_the_cli(served):
    s, run, base, sibling = served
    listed = httpx.get(s.url + "/api/baselines").json()["candidates"]
    assert [(c["name"], c["given"]) for c in listed] == [("base", True), ("sibling", False)]
    api = httpx.get(s.url + "/api/compare").json()  # the --baseline dirs by default
    code, cli = compare_json(run, base)
    assert code == 1 and api["failed"] == cli["failed"] == ["train/grad_norm"]
    assert api["slower"] == cli["slower"] == ["perf/rollout_time"]  # timing: reported, not gated
    assert [(x["key"], x["verdict"], x["first_step"]) for x in api["signals"]] == \
        [(x["key"], x["verdict"], x["first_step"]) for x in cli["signals"]]
    assert set(api["curves"]) == {str(run), str(base)}
    both = httpx.get(s.url + "/api/compare", params={"baseline": [str(base), str(sibling)]}).json()
    assert [b["name"] for b in both["baselines"]] == ["base", "sibling"]
    refused = httpx.get(s.url + "/api/compare", params={"baseline": "/etc"})
    assert refused.status_code == 400 and "not one of the listed candidates" in refused.json()["detail"]


@pytest.mark.skipif(os.environ.get("MILES_NO_BROWSER") == "1", reason="MILES_NO_BROWSER=1")
def test_browser_view_shows_the_verdicts_curves_and_deltas(served):
    from webdriver import Browser, missing_browser

    if missing_browser() is not None:
        pytest.skip(str(missing_browser()))
    s, run, base, sibling = served
    code, cli = compare_json(run, base)
    browser = Browser()
    try:
        browser.open(s.url + "/#compare")
        rows = browser.script("return [...document.querySelectorAll('#compare-table tr.signal-row')].map(r => "
                              "[r.dataset.key, r.dataset.verdict, r.dataset.firstStep])")
        assert rows == [[x["key"], x["verdict"], "" if x["first_step"] is None else str(x["first_step"])]
                        for x in cli["signals"]]
        assert "regression" in browser.text("#compare-verdict")
        panels = browser.find_all(".compare-panel")
        assert len(panels) == len(cli["signals"])
        grad = '.compare-panel[data-key="train/grad_norm"]'
        assert len(browser.find_all(f"{grad} path.run")) == 1 and len(browser.find_all(f"{grad} path.baseline")) == 1
        assert len(browser.find_all(f"{grad} path.corridor")) == 1 and len(browser.find_all(f"{grad} rect.red-flag")) == 1
        delta = browser.text('#compare-table tr[data-key="train/grad_norm"] td.delta')
        first = next(p for p in next(x for x in cli["signals"] if x["key"] == "train/grad_norm")["points"]
                     if p["step"] == 3)
        assert float(delta) == pytest.approx(first["delta"], rel=1e-3)
        browser.screenshot(SHOTS / "compare.png")
        # choosing the sibling too: two baselines on every chart
        browser.click(f'#baseline-picker input[data-path="{sibling}"]')
        browser.wait_true("document.querySelectorAll('.compare-panel[data-key=\"train/grad_norm\"] path.baseline')"
                          ".length === 2")
    finally:
        browser.close()


def test_a_baseline_that_is_not_a_run_dir_is_refused(tmp_path):
    import subprocess
    import sys

    run = copy_run(tmp_path / "run")
    done = subprocess.run([sys.executable, "-m", "miles.dashboard.cli", str(run), "--baseline", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--baseline: " in done.stderr and "Traceback" not in done.stderr
