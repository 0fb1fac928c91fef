"""Issue 54: the timeline view's rank x phase heat map in a real headless Chromium (skipped without
one): a hand-made timeline whose rank1 is slow in backward shows that cell reddest and names it; the
recorded run (no rank phase spans) says the map is not available."""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

import pytest
from tests.support.dashboard import serve
from tests.support.rank_timelines import COORDS, rank_spans
from webdriver import missing_browser

pytestmark = pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))
SHOTS = Path(os.environ.get("MILES_SCREENSHOT_DIR",
                           Path(__file__).parents[2] / "runs" / "screenshots"))


def test_the_heat_map_marks_the_slow_rank_and_phase(browser, run_copy):
    with (run_copy / "timeline.jsonl").open("a") as f:
        f.write("".join(s.to_json() + "\n" for s in rank_spans()))
    (run_copy / "profiler").mkdir()
    (run_copy / "profiler" / "rank1-train_actor.json.gz").write_bytes(b"a trace")
    window = {"target": "train_actor", "rank": 1, "start": 1, "end": 2, "top_ops": [],
              "spans": {}, "trace": "profiler/rank1-train_actor.json.gz"}
    (run_copy / "profiler" / "summaries.jsonl").write_text(json.dumps(window) + "\n")
    served = serve(run_copy)
    try:
        browser.open(served.url + "/#timeline")
        rows = browser.script("return [...document.querySelectorAll('#rank-heatmap tr')].map(r => "
                              "[...r.children].map(c => c.textContent))")
        assert rows[0] == ["rank", "forward", "backward", "optimizer"]
        assert [r[0] for r in rows[1:]] == [f"{lane} ({c})" for lane, c in COORDS.items()]
        assert rows[2][2] == "3.000 s"
        styles = browser.script("return [...document.querySelectorAll("
                                "'#rank-heatmap td.rank-cell')]"
                                ".map(c => getComputedStyle(c).backgroundColor)")
        reddest = styles.index(min(styles, key=lambda s: int(s.split(",")[1])))  # least green
        assert reddest == 1 * 3 + 1  # rank1's backward
        hottest = browser.text("#rank-heatmap-hottest")
        assert hottest.startswith(f"slowest: {COORDS['rank1']} in backward")
        browser.screenshot(SHOTS / "rank-heatmap.png")
        # a click on that cell picks rank1's backward spans on the timeline; a second one clears it
        cell = "#rank-heatmap tr:nth-child(3) td:nth-child(3)"
        picked = ("return [...document.querySelectorAll('#timeline-svg rect.span.picked')]"
                  ".map(r => r.dataset.lane + ' ' + r.dataset.name)")
        faded = "return document.querySelectorAll('#timeline-svg rect.span.faded').length"
        browser.click(cell)
        assert browser.script(picked) == ["rank1 backward"] * 2  # one per rollout
        assert browser.script(faded) == len(browser.find_all("#timeline-svg rect.span")) - 2
        # ... and lists rank1's profiler window under the map, a link to its trace
        assert browser.text("#rank-heatmap-traces") == (
            f"rank1 ({COORDS['rank1']}): profiler traces: train_actor rollouts 1-2")
        browser.screenshot(SHOTS / "rank-heatmap-traces.png")
        href = browser.script("return document.querySelector('a.rank-trace').href")
        assert httpx.get(href).content == b"a trace"
        browser.click(cell)
        assert browser.script(picked) == [] and browser.script(faded) == 0
        browser.click("#rank-heatmap tr:nth-child(2) td:nth-child(2)")  # rank0 ran no window
        assert browser.text("#rank-heatmap-traces").endswith("no profiler window ran on this "
                                                            "rank (--use-pytorch-profiler, "
                                                            "--profile-ranks)")
    finally:
        served.stop()


def test_a_run_without_rank_phase_spans_says_so(browser, run_copy):
    served = serve(run_copy)
    try:
        browser.open(served.url + "/#timeline")
        assert browser.text("#rank-heatmap-na").startswith("Rank heat map: not available")
    finally:
        served.stop()
