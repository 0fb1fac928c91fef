"""Issue 54: the Metrics view's mismatch-by-position panel (/api/mismatch,
miles/dashboard/mismatch_view.py), on the recorded run given per-position mismatch figures whose
last rollout's mismatch grows along the response; the API, and the page in a real headless
Chromium (that part skipped without one). The recorded run itself predates the figures: no panel."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tests.support.dashboard import serve
from webdriver import Browser, missing_browser

from miles.dashboard.app import build_app

SHOTS = Path(os.environ.get("MILES_SCREENSHOT_DIR",
                           Path(__file__).parents[2] / "runs" / "screenshots"))
BUCKETS = ["0-4", "4-8", "8-16", "16-32"]  # written out of order below: the panel sorts them


def with_position_figures(run_dir: Path) -> None:
    """Rollout r's bucket b gets k3 = 1e-6 * (1 + b) * 10^r: the last rollout's last is worst."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        r = row["rollout_id"]
        if r < 0:
            continue
        for b, bucket in reversed(list(enumerate(BUCKETS))):
            row[f"train/mismatch_pos/k3/{bucket}"] = 1e-6 * (1 + b) * 10 ** r
            row[f"train/mismatch_pos/abs_diff/{bucket}"] = 1e-3 * (1 + b)
            row[f"train/mismatch_pos/tokens/{bucket}"] = 0.25
        row["train/mismatch_k3"] = 2.5e-6 * 10 ** r
        row["train/mismatch_ratio_p99"] = 1.0 + 0.01 * r
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_api_lays_out_rollouts_by_position_bucket(run_copy):
    client = TestClient(build_app(run_copy))
    assert client.get("/api/mismatch").json()["available"] is False  # recorded before the figures
    with_position_figures(run_copy)
    data = client.get("/api/mismatch").json()
    assert data["available"] and data["buckets"] == BUCKETS
    last = data["rollouts"][-1]
    assert data["rollouts"] == list(range(last + 1))
    assert data["worst"] == {"k3": pytest.approx(4e-6 * 10 ** last), "rollout_id": last,
                             "bucket": "16-32"}
    assert data["cells"][0][1] == {"k3": pytest.approx(2e-6), "abs_diff": pytest.approx(2e-3),
                                   "tokens": 0.25}
    assert data["ratio_p99"][last] == pytest.approx(1.0 + 0.01 * last)


@pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))
def test_the_page_reddens_where_the_mismatch_sits(run_copy):
    with_position_figures(run_copy)
    served = serve(run_copy)
    browser = Browser()
    try:
        browser.open(served.url + "/#metrics")
        rows = browser.script("return [...document.querySelectorAll('#mismatch-heatmap tr')]"
                              ".map(r => "
                              "[...r.children].map(c => c.textContent))")
        assert rows[0] == ["rollout / tokens", *BUCKETS, "all k3", "ratio p99"]
        assert [r[0] for r in rows[1:]] == [str(i) for i in range(len(rows) - 1)]
        styles = browser.script("return [...document.querySelectorAll('#mismatch-heatmap "
                                "td.mismatch-cell')].map(c => getComputedStyle(c).backgroundColor)")
        reddest = styles.index(min(styles, key=lambda s: int(s.split(",")[1])))  # least green
        assert reddest == len(styles) - 1  # the last rollout's last bucket
        assert browser.text("#mismatch-worst").startswith(
            f"largest: k3 {4e-6 * 10 ** (len(rows) - 2):.4g} at response tokens 16-32")
        browser.script("document.getElementById('mismatch-worst').previousSibling.scrollIntoView()")
        browser.screenshot(SHOTS / "mismatch-heatmap.png")
    finally:
        browser.close()
        served.stop()
