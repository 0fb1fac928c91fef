"""The page in a real headless Chromium: every view renders the recorded run, a click on a sample
opens its tokens, and `--follow` shows a new iteration appear. Screenshots of each view go to
`runs/screenshots/` (or MILES_SCREENSHOT_DIR)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.support.dashboard import RECORDED, serve
from webdriver import missing_browser

pytestmark = pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))
SHOTS = Path(os.environ.get("MILES_SCREENSHOT_DIR", Path(__file__).parents[2] / "runs" / "screenshots"))


@pytest.fixture
def served(run_copy):
    s = serve(run_copy)
    try:
        yield s
    finally:
        s.stop()


def test_metrics_view(browser, served):
    browser.open(served.url + "/#metrics")
    assert len(browser.find_all(".watch-panel")) == 8
    # every panel the run logged has a line; kl_loss (no --use-kl-loss) says so instead
    assert len(browser.find_all(".watch-panel path.series")) >= 8
    assert browser.text(".watch-panel .na") == "not logged"
    assert len(browser.find_all(".watch-panel line.threshold")) == 2  # grad_norm at clip_grad, pg_clipfrac at 0.2
    assert len(browser.find_all(".metric-panel")) > 20
    # a healthy run: the watch ran and flagged nothing, so no health.jsonl; shown green, not "not available"
    # the banner is on every view: it counts the signals, their names are its tooltip (first-hour N20)
    assert browser.text("#health-ok") == "Health watch: no red flags in 4 rollouts (10 signals checked)"
    tooltip = browser.script("return document.getElementById('health-ok').getAttribute('title')")
    assert tooltip.startswith("signals checked: ") and len(tooltip.split(": ", 1)[1].split(", ")) == 10
    assert browser.find_all("#missing") == []  # the notice is drawn at once, with #health-ok
    assert browser.text("#watch-healthy").startswith("Health verdicts: none (the watch judged 4 rollouts")
    assert browser.text("#off") == "profiling off (no profiler window in this run)"
    browser.screenshot(SHOTS / "metrics.png")


def test_metric_legends_have_the_lines_colours(browser, served):
    browser.open(served.url + "/#metrics")
    panel = "[...document.querySelectorAll('.watch-panel')].find(p => p.querySelector('h3').textContent" \
            ".startsWith('rollout_time vs train_time'))"
    strokes = browser.script(f"return [...{panel}.querySelectorAll('path.series')].map(p => p.getAttribute('stroke'))")
    swatches = browser.script(f"return [...{panel}.querySelectorAll('.legend .legend-item')].map(i => "
                              "[i.textContent, getComputedStyle(i.querySelector('.swatch')).borderTopColor])")
    hex_rgb = lambda h: "rgb({}, {}, {})".format(*(int(h[i:i + 2], 16) for i in (1, 3, 5)))  # noqa: E731
    assert len(set(strokes)) == 2 and [name for name, _ in swatches] == ["perf/rollout_time", "perf/train_time"]
    assert [colour for _, colour in swatches] == [hex_rgb(c) for c in strokes]  # each name beside its line's colour
    # the threshold's entry is a dashed red swatch
    dashed = browser.script("return [...document.querySelectorAll('.watch-panel .swatch.dashed')]"
                            ".map(s => getComputedStyle(s).borderTopStyle)")
    assert dashed == ["dashed", "dashed"]  # grad_norm's clip_grad, pg_clipfrac's 0.2


def test_metrics_axes_and_flat_series(browser, served):
    browser.open(served.url + "/#metrics")
    # step axes tick at whole steps only (the 4-rollout run's middle is 2, not 1.5)
    ticks = browser.script("return [...document.querySelectorAll('.metric-panel text[text-anchor=\"middle\"]')]"
                           ".map(t => t.textContent)")  # the x ticks (the y ticks and axis label end-anchored)
    assert ticks and all(float(t).is_integer() for t in ticks), sorted(set(ticks))
    # the health watch's 0s are one line, not ten flat charts
    titles = browser.script("return [...document.querySelectorAll('.metric-panel h3')].map(h => h.textContent)")
    assert not any(t.startswith("health/") for t in titles)
    flat = browser.text('.legend.flat[data-namespace="health"]')
    assert flat.startswith("flat over the run (10): ") and "health/grad_norm = 0" in flat
    journal = [json.loads(line) for line in (RECORDED / "metrics.jsonl").read_text().splitlines()]
    moving = {k for k in journal[1] if k.startswith("train/") and k != "train/step" and len({row.get(k) for row in journal[1:]}) > 1}
    assert moving and moving <= set(titles)  # what moved is still drawn


def _is_round_scale(ticks: list[float]) -> bool:
    """Evenly spaced multiples of one step whose leading digits are 1, 2, 2.5 or 5 (0 0.5 1 1.5 2)."""
    import math
    if len(ticks) < 2:
        return False
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    return (any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5, 10))
            and all(math.isclose(b - a, step, rel_tol=1e-3) for a, b in zip(ticks, ticks[1:]))
            and all(abs(t / step - round(t / step)) < 1e-3 for t in ticks))


def test_y_axes_tick_at_round_numbers(browser, served):
    browser.open(served.url + "/#metrics")
    # each chart's y ticks (end-anchored, left of the axis at x=41), not min/mid/max (0.148 1.08 2)
    per_chart = browser.script(
        "return [...document.querySelectorAll('.watch-panel svg.chart, .metric-panel svg.chart')].map(svg => "
        "[...svg.querySelectorAll('text[text-anchor=\"end\"][x=\"41\"]')].map(t => Number(t.textContent)))")
    assert len(per_chart) > 20
    odd = [ticks for ticks in per_chart if not _is_round_scale(ticks)]
    assert not odd, odd[:5]


def test_health_verdicts_are_marked_on_their_panels(browser, run_copy):
    verdicts = [{"rollout_id": 2, "signal": "grad_norm", "severity": "warning",
                 "message": "grad_norm above clip_grad in 3 of the last 4 iterations", "values": {"grad_norm": 2.2}},
                {"rollout_id": 3, "signal": "entropy_loss", "severity": "red",
                 "message": "entropy falling fast", "values": {}}]
    (run_copy / "health.jsonl").write_text("".join(json.dumps(v) + "\n" for v in verdicts))
    served = serve(run_copy)
    try:
        browser.open(served.url + "/#metrics")
        assert len(browser.find_all(".watch-panel rect.red-flag")) == 2
        messages = browser.script("return [...document.querySelectorAll('.watch-panel .flag')].map(f => f.textContent)")
        assert any("rollout 2 warning: grad_norm above clip_grad" in m for m in messages)
        assert browser.find_all("#missing") == []  # nothing is missing: the profiler is only "off"
        assert browser.find_all("#health-ok") == [] and browser.find_all("#watch-healthy") == []  # flagged: not green
        # but the line stays, red (N32: a flagged run had no health line on any view)
        assert browser.text("#health-flags") == (
            "Health watch: red flags on entropy_loss (1); warnings on grad_norm (1)")
        browser.screenshot(SHOTS / "metrics-health.png")
    finally:
        served.stop()


def test_a_run_with_warnings_only_keeps_an_amber_health_line(browser, run_copy):
    verdicts = [{"rollout_id": r, "signal": "rollout_train_time", "severity": "warning",
                 "message": "imbalance", "values": {}} for r in (2, 3)]
    (run_copy / "health.jsonl").write_text("".join(json.dumps(v) + "\n" for v in verdicts))
    served = serve(run_copy)
    try:
        browser.open(served.url + "/#timeline")
        line = browser.text("#health-flags")
        want = "Health watch: no red flags in 4 rollouts; warnings on rollout_train_time (2)"
        assert line == want
        classes = browser.script("return document.getElementById('health-flags').className")
        assert classes == "health-warn"
    finally:
        served.stop()


def test_timeline_view(browser, served):
    browser.open(served.url + "/#timeline")
    recorded = [json.loads(line) for line in (RECORDED / "timeline.jsonl").read_text().splitlines()]
    trained = [s for s in recorded if s.get("rollout_id") is not None]
    first = min(s["start"] for s in trained)
    # it opens on the iterations: the engine's start-up probes before them are out of view
    assert len(browser.find_all("#timeline-svg rect.span")) == sum(s["end"] >= first for s in recorded)
    browser.screenshot(SHOTS / "timeline.png")
    # the last time tick ends inside the chart instead of being cut off at its right edge
    inside = browser.script("const svg = document.getElementById('timeline-svg').getBoundingClientRect();"
                            "const ticks = [...document.querySelectorAll('#timeline-svg text[y=\"12\"]')];"
                            "return ticks.length === 5 && ticks.every(t => t.getBoundingClientRect().right <= svg.right);")
    assert inside
    # the legend names the phases and events this run has, not every one there could be
    legend = browser.script("return [...document.querySelectorAll('#timeline-svg + .legend span')].map(s => s.textContent)")
    assert sorted(legend) == sorted({s["name"] for s in recorded})
    assert "quarantine" not in legend and "rollout" in legend
    browser.script("document.getElementById('timeline-svg').dispatchEvent(new MouseEvent('dblclick'))")
    assert len(browser.find_all("#timeline-svg rect.span")) == len(recorded)  # zoomed out: everything
    labels = browser.script("return [...document.querySelectorAll('#timeline-svg text')].map(t => t.textContent)")
    assert any(label.startswith("rank1 (") for label in labels) and any(label.startswith("router (") for label in labels)
    assert browser.script("return document.getElementById('chrome-trace').getAttribute('href')") == \
        "/api/timeline/chrome"


def test_rollouts_view_and_filters(browser, served):
    browser.open(served.url + "/#rollouts")
    rows = browser.find_all("#samples-table tr.sample-row")
    assert len(rows) == 16  # the last logged rollout, all samples
    assert browser.find_all("#samples-table td.zero")  # rollout 2 has a zero-std group
    # the expected answer is beside each response
    headers = browser.script("return [...document.querySelectorAll('#samples-table th')].map(h => h.textContent)")
    assert headers[-3:] == ["prompt", "label", "response"]
    labels = browser.script("return [...document.querySelectorAll('#samples-table td.label')].map(td => td.textContent)")
    recorded = [json.loads(line) for line in (RECORDED / "samples" / "rollout_000002.jsonl").read_text().splitlines()]
    assert labels == [row["label"] for row in recorded]
    browser.screenshot(SHOTS / "rollouts.png")
    browser.open(served.url + "/#rollouts?rollout=2&min_reward=1")
    rewards = browser.script("return [...document.querySelectorAll('#samples-table tr.sample-row td:nth-child(3)')]"
                             ".map(td => Number(td.textContent))")
    assert rewards and all(r >= 1 for r in rewards)
    # a value the server refuses names the field and what is wrong with it, not "422 [object Object]"
    browser.open(served.url + "/#rollouts?rollout=0&min_reward=abc")
    error = browser.text("#view .missing")
    assert "min_reward: " in error and "number" in error and '"abc"' in error, error
    assert "[object Object]" not in error


def test_click_on_a_sample_opens_its_tokens(browser, served):
    browser.open(served.url + "/#rollouts?rollout=0")
    browser.click('#samples-table tr.sample-row[data-index="2"]')
    browser.wait_view("#sample/0/2")
    assert browser.text("#sample-title") == "Rollout 0, sample 2"
    tokens = json.loads((RECORDED / "tokens" / "rollout_000000.jsonl").read_text().splitlines()[2])
    assert len(browser.wait_for("#token-strip .tok")) == len(tokens["ids"])
    colours = browser.script("return [...document.querySelectorAll('#token-strip .tok')].map(t => t.style.backgroundColor)")
    assert len(set(colours)) > 1  # coloured by log-prob, not uniform
    browser.screenshot(SHOTS / "tokens.png")
    # the nav calls the view "Tokens": #tokens/... is the same view, not a silent Metrics (first-hour N16)
    browser.open(served.url + "/#tokens/0/2")
    assert browser.text("#sample-title") == "Rollout 0, sample 2"
    assert browser.find_all("#unknown-view") == []
    browser.open(served.url + "/#metrix")
    assert browser.text("#unknown-view").startswith('No view "metrix": the views are metrics, timeline')
    assert len(browser.find_all(".watch-panel")) == 8


def test_a_zero_difference_is_charted_on_a_non_negative_axis(browser, run_copy):
    row = {"rollout_id": 4, "index": 0, "group_index": 0, "prompt": "2+2=", "response": "4", "label": "4",
           "reward": 1.0, "response_length": 3, "status": "completed"}
    (run_copy / "samples" / "rollout_000004.jsonl").write_text(json.dumps(row) + "\n")
    same = [-0.25, -0.5, -0.125, -0.25]  # training and rollout log-probs equal: |difference| 0 on every token
    tokens = {"index": 0, "group_index": 0, "ids": [1, 2, 3, 4], "text": ["4", "", "", ""], "rollout_log_probs": same,
              "log_probs": same, "entropy": [0.5, 0.25, 0.5, 0.5], "loss_mask": [1, 1, 1, 1]}
    (run_copy / "tokens" / "rollout_000004.jsonl").write_text(json.dumps(tokens) + "\n")
    served = serve(run_copy)
    try:
        browser.open(served.url + "/#sample/4/0?color=abs_diff")
        axis = browser.script(
            "const p = [...document.querySelectorAll('#token-charts .panel')].find(p => p.querySelector('h3')"
            ".textContent === '|difference| per token');"
            "return [...p.querySelectorAll('text')].filter(t => t.getAttribute('text-anchor') === 'end')"
            ".map(t => t.textContent)")
        assert axis[0] == "0" and axis[-2] == "1" and axis[-1] == "token"  # [0, 1], not -0.5 .. 0.5
        # four token positions tick 0 1 2 3 (they read 0 2 3: first-hour N20)
        xs = browser.script(
            "const p = [...document.querySelectorAll('#token-charts .panel')].find(p => p.querySelector('h3')"
            ".textContent === '|difference| per token');"
            "return [...p.querySelectorAll('text.x-tick')].map(t => t.textContent)")
        assert xs == ["0", "1", "2", "3"]
    finally:
        served.stop()


def test_conversation_view_dims_observation_tokens(browser, run_copy):
    messages = [{"role": "user", "content": "What is 12+30? Use the calculator."},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc",
                                                                                  "arguments": "{\"expr\": \"12+30\"}"}}]},
                {"role": "tool", "content": "42"}, {"role": "assistant", "content": "42"}]
    row = {"rollout_id": 4, "index": 0, "group_index": 0, "prompt": messages[0]["content"], "response": "calc 42 42",
           "reward": 1.0, "response_length": 8, "status": "completed", "messages": messages}
    (run_copy / "samples" / "rollout_000004.jsonl").write_text(json.dumps(row) + "\n")
    text = ["c", "a", "l", "c", "4", "2", "4", "2"]
    tokens = {"index": 0, "group_index": 0, "ids": list(range(8)), "text": text,
              "rollout_log_probs": [-0.1, -0.2, -0.1, -0.3, 0, 0, -0.5, -0.2], "log_probs": [-0.1] * 8,
              "entropy": [0.5] * 8, "loss_mask": [1, 1, 1, 1, 0, 0, 1, 1]}
    (run_copy / "tokens" / "rollout_000004.jsonl").write_text(json.dumps(tokens) + "\n")
    served = serve(run_copy)
    try:
        browser.open(served.url + "/#sample/4/0?color=entropy")
        roles = browser.script("return [...document.querySelectorAll('#conversation .msg .role')]"
                               ".map(r => r.textContent)")
        assert roles[:2] == ["user", "assistant"] and any("tool call: calc" in r for r in roles)
        assert len(browser.find_all("#token-strip .tok.masked")) == 2
        browser.screenshot(SHOTS / "conversation.png")
    finally:
        served.stop()


def test_follow_shows_a_new_iteration(browser, run_copy):
    journal = (run_copy / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run_copy / "metrics.jsonl").write_text("".join(journal[:3]))  # the run so far: base eval, 2 iterations
    served = serve(run_copy, "--follow")
    try:
        browser.open(served.url + "/#metrics")
        assert "last rollout 1" in browser.text("#run-state")
        points = "document.querySelectorAll('.watch-panel:first-child circle').length"
        assert browser.script(f"return {points}") == 2
        with (run_copy / "metrics.jsonl").open("a") as f:  # the trainer records the next iteration
            f.write(journal[3])
        # the page polls every 2 s and redraws when the last rollout changed
        browser.wait_true(f"document.getElementById('run-state').textContent.includes('last rollout 2') "
                          f"&& {points} === 3", timeout=30)
    finally:
        served.stop()
