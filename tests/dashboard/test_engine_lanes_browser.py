"""Issue 54: the timeline's engine lanes show each engine's own weight-push phases in a real
headless Chromium (skipped without one). The recorded run's timeline gets, inside each of its
pushes, the spans two engines' recorders write (`miles.engines.push_spans.PushSpans`, the
engine's own code path: receive per bucket, the waits between, apply), engine 1 slower."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.support.dashboard import serve
from webdriver import missing_browser

from miles.engines.push_spans import COMPUTE, WAIT, EngineCoords, PushSpans
from miles.record.timeline import TimelineWriter

pytestmark = pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))
SHOTS = Path(os.environ.get("MILES_SCREENSHOT_DIR",
                           Path(__file__).parents[2] / "runs" / "screenshots"))
PORTS = (31001, 31002)


def add_engine_push_spans(run_dir: Path) -> int:
    """Three buckets then the apply on each engine, inside every push; the spans written."""
    path = run_dir / "timeline.jsonl"
    pushes = pushes_of(run_dir)
    written = 0
    for index, port in enumerate(PORTS):
        writer = TimelineWriter(path, lane=f"engine 127.0.0.1:{port}")
        spans = PushSpans(writer, EngineCoords(index, f"http://127.0.0.1:{port}"))
        for push in pushes:
            t, step = push["start"], (push["end"] - push["start"]) / 12
            version = str(push["args"]["version"])
            for bucket in range(3):
                if bucket:
                    spans.add("receive", WAIT, t, t + step, group="miles-pp_0")
                    t += step
                spans.add("receive", COMPUTE, t, t + step, source="broadcast", tensors=4)
                t += step
            apply = step * (3 if index == 1 else 1)  # engine 1 applies slowly
            spans.add("apply", WAIT, t, t + step / 2, version)
            spans.add("apply", COMPUTE, t + step / 2, t + step / 2 + apply, version)
            written += 7
        writer.close()
    return written


def pushes_of(run_dir: Path) -> list[dict]:
    spans = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
    return [s for s in spans if s["lane"] == "trainer" and s["name"] == "update_weights"]


ZOOM_ON_LAST_PUSH = """
const svg = document.getElementById('timeline-svg'), box = svg.getBoundingClientRect();
const push = [...svg.querySelectorAll('rect.span')]
  .filter(r => r.dataset.lane === 'trainer' && r.dataset.name === 'update_weights').pop();
const x = (u) => box.left + u / 1200 * box.width;
const x0 = +push.getAttribute('x'), x1 = x0 + +push.getAttribute('width');
svg.dispatchEvent(new MouseEvent('mousedown', {clientX: x(x0) - 0.2}));
svg.dispatchEvent(new MouseEvent('mouseup', {clientX: x(x1) + 0.2}));
"""


def test_the_engine_lanes_show_their_push_phases(browser, run_copy):
    written = add_engine_push_spans(run_copy)
    served = serve(run_copy)
    try:
        browser.open(served.url + "/#timeline")
        browser.script("document.getElementById('timeline-svg')"
                       ".dispatchEvent(new MouseEvent('dblclick'))")  # everything
        rects = browser.script(
            "return [...document.querySelectorAll('#timeline-svg rect.span')]"
            ".filter(r => r.dataset.lane.startsWith('engine 127.0.0.1:3100'))"
            ".map(r => [r.dataset.lane, r.dataset.name, r.getAttribute('fill'),"
            " r.querySelector('title').textContent])")
        assert len(rects) == written
        for index, port in enumerate(PORTS):
            mine = [r for r in rects if r[0] == f"engine 127.0.0.1:{port}"]
            assert {r[1] for r in mine} == {"receive", "wait", "apply"}
            assert all(f'"coords":"engine{index} http://127.0.0.1:{port}"' in r[3] for r in mine)
        fills = {name: fill for _, name, fill, _ in rects}
        assert len(set(fills.values())) == 3  # receive, apply and the waits told apart
        assert fills["wait"] == "#e5e7eb"  # the ranks' wait grey
        labels = browser.script("return [...document.querySelectorAll('#timeline-svg text')]"
                                ".map(t => t.textContent)")
        assert any(label.startswith(f"engine 127.0.0.1:{PORTS[1]} (") for label in labels)
        legend = browser.script("return [...document.querySelectorAll('#timeline-legend span')]"
                                ".map(s => s.textContent)")
        assert {"receive", "apply", "wait"} <= set(legend)
        last = pushes_of(run_copy)[-1]["rollout_id"]
        browser.open(served.url + f"/#timeline?rollout={last}")  # its rollout, then its push
        browser.script(ZOOM_ON_LAST_PUSH)  # a drag across the last push, as a user zooms
        zoomed = browser.script("return [...document.querySelectorAll('#timeline-svg rect.span')]"
                                ".filter(r => r.dataset.lane.startsWith('engine 127.0.0.1:3100'))"
                                ".length")
        assert zoomed == written // len(pushes_of(run_copy))  # one push's spans fill the view
        browser.screenshot(SHOTS / "timeline-engine-lanes.png")
    finally:
        served.stop()
