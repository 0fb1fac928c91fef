"""The per-prompt eval diff on real recorded runs (`tests/compare/recorded/`: a default run and the same
flags with `--lr 0`, each with its `samples/eval/` files): the prompts whose pass rate changed most, each
delta what the two runs' own files say, and the CLI, the API and the browser view list the same."""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from compare_helpers import compare_json, miles, serve

RECORDED = Path(__file__).parent / "recorded"
SHOTS = Path(os.environ.get("MILES_SCREENSHOT_DIR", Path(__file__).parents[2] / "runs" / "screenshots"))


def pass_rates(run: Path, step: int) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "samples" / "eval" / f"rollout_{step:06d}.jsonl").read_text().splitlines()]
    return {r["prompt"]: r["pass_rate"] for r in rows}


def test_the_prompts_that_changed_most(tmp_path):
    run, base = RECORDED / "lr-zero", RECORDED / "default-1"
    code, report = compare_json(run, base, "--top-prompts", "5")
    diff = report["prompts"]
    assert diff["eval_step"] == 7 and diff["shared"] == 64
    mine, theirs = pass_rates(run, 7), pass_rates(base, 7)
    expected = sorted(((mine[p] - theirs[p], p) for p in mine), key=lambda dp: (-abs(dp[0]), dp[1]))[:5]
    assert [c["prompt"] for c in diff["changes"]] == [p for _, p in expected]
    assert [c["delta"] for c in diff["changes"]] == pytest.approx([d for d, _ in expected])
    table = miles("compare", run, base, "--top-prompts", "5").stdout
    assert "eval prompts whose pass rate changed most (eval step 7, 64 shared)" in table
    assert all(repr(c["prompt"])[:20] in table for c in diff["changes"])


def test_the_dashboard_lists_the_same_prompts(tmp_path):
    from webdriver import Browser, missing_browser

    run, base = RECORDED / "lr-zero", RECORDED / "default-1"
    code, cli = compare_json(run, base)
    served = serve(run, "--baseline", str(base))
    try:
        api = httpx.get(served.url + "/api/compare").json()
        assert api["prompts"] == cli["prompts"] and api["failed"] == cli["failed"]
        if missing_browser() is not None:
            pytest.skip(str(missing_browser()))
        browser = Browser()
        try:
            browser.open(served.url + "/#compare")
            prompts = browser.script("return [...document.querySelectorAll('#prompt-diff tr.prompt-row "
                                     "td:nth-child(2)')].map(td => td.textContent)")
            assert prompts == [c["prompt"] for c in cli["prompts"]["changes"]]
            rows = browser.script("return [...document.querySelectorAll('#compare-table tr.signal-row')]"
                                  ".map(r => [r.dataset.key, r.dataset.verdict])")
            assert rows == [[s["key"], s["verdict"]] for s in cli["signals"]]
            browser.screenshot(SHOTS / "compare-lr-zero.png")
        finally:
            browser.close()
    finally:
        served.stop()
