"""The dashboard's routing panel (/api/routing and the Metrics view in a real headless Chromium,
skipped without one): the recorded run's rollouts given the routing of the tiny Qwen3-MoE's own
training forwards, healthy at rollout 0 and forced onto expert 0 from rollout 1, show each layer's
busiest expert per rollout, the collapsed cells over the bound and the red-flagged rollout; a
dense run shows no panel."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from miles.config import parse_config
from miles.dashboard.routing_view import routing_view
from miles.health import replay
from miles.health.detectors import RunFacts
from tests.support.dashboard import copy_recorded, serve
from webdriver import Browser, missing_browser

SHOTS = Path(os.environ.get("MILES_SCREENSHOT_DIR",
                           Path(__file__).parents[2] / "runs" / "screenshots"))
CFG = parse_config([]).health


def routing_of_rollouts(n: int) -> list[dict[str, float]]:
    """`moe/*` of `n` training forwards of the tiny MoE over 16 task problems each: rollout 0 with
    fresh routers, the others with every token forced onto expert 0."""
    import random

    from miles.moe.capture import RouterCapture
    from miles.moe.routing_stats import routing_metrics
    from miles.tiny.moe_model import build_tiny_moe_model
    from miles.tiny.task import all_problems

    model, tokenizer = build_tiny_moe_model(0)
    capture = RouterCapture.attach(model)
    problems, rng, out = all_problems(), random.Random(0), []
    for i in range(n):
        if i == 1:
            with torch.no_grad():
                model.model.embed_tokens.weight[:, 0] = 50.0
                for layer in model.model.layers:
                    layer.mlp.gate.weight.zero_()
                    layer.mlp.gate.weight[0, 0] = 10.0
        enc = tokenizer([p.prompt + p.label for p in rng.sample(problems, 16)],
                        return_tensors="pt", padding=True)
        model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
        out.append(routing_metrics(capture.take()))
    return out


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory) -> Path:
    """A copy of the recorded run whose rollouts carry routing figures and whose health log holds
    the watch's verdicts on them."""
    from miles.health import Rollout

    run = copy_recorded(tmp_path_factory.mktemp("moe"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if row["rollout_id"] >= 0]
    for row, routing in zip(trained, routing_of_rollouts(len(trained))):
        row.update(routing)
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    rollouts = [Rollout(row["rollout_id"], row) for row in trained]
    verdicts = replay(rollouts, CFG, RunFacts(1.0, 4, False))
    (run / "health.jsonl").write_text("".join(json.dumps(v.as_json()) + "\n" for v in verdicts))
    return run


def test_the_view_lays_out_layers_by_rollouts(moe_run):
    journal = [json.loads(line) for line in (moe_run / "metrics.jsonl").read_text().splitlines()]
    health = [json.loads(line) for line in (moe_run / "health.jsonl").read_text().splitlines()]
    view = routing_view(journal, health, {})
    assert view["available"] and view["layers"] == [0, 1] and view["rollouts"] == [0, 1, 2, 3]
    assert view["bound"] == CFG.health_router_max_share
    fresh, stuck = view["cells"][1][0], view["cells"][1][3]
    assert fresh["share"] < 1.0 and fresh["balanced"] == pytest.approx(0.5)  # top-2 of 4
    assert stuck["share"] == 1.0 and stuck["expert"] == 0.0 and stuck["dead"] == 2.0
    assert view["flagged"] == [3]  # the window of 3 held at rollout 3
    assert routing_view([{"rollout_id": 0, "train/loss": 0.1}], [], {})["available"] is False


@pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))
def test_the_metrics_view_shows_the_panel_in_chromium(moe_run, tmp_path):
    browser = Browser()
    served = [serve(moe_run)]
    try:
        browser.open(served[0].url + "/#metrics")
        browser.wait_for("#routing-heatmap")
        rows = browser.script("return [...document.querySelectorAll('#routing-heatmap tr')].map("
                              "r => [...r.children].map(c => c.textContent))")
        assert rows[0] == ["layer / rollout", "0", "1", "2", "3"]
        assert [r[0] for r in rows[1:]] == ["layer 0", "layer 1"]
        assert rows[2][2:] == ["0", "0", "0"]  # expert 0 from rollout 1 on
        over = browser.script("return [...document.querySelectorAll('#routing-heatmap td.over')]"
                              ".length")
        assert over == 6  # both layers, rollouts 1-3
        flagged = browser.script("return [...document.querySelectorAll('#routing-heatmap th.flag')]"
                                 ".map(c => c.textContent)")
        assert flagged == ["3"]
        assert "of its tokens" in browser.text("#routing-worst")
        browser.script("document.getElementById('routing-heatmap').previousElementSibling"
                       ".previousElementSibling.scrollIntoView()")
        browser.screenshot(SHOTS / "routing-heatmap.png")
        served.append(serve(copy_recorded(tmp_path)))  # the dense recorded run: no panel
        browser.open(served[1].url + "/#metrics")
        browser.wait_for(".metric-panel")  # drawn after the routing panel's place
        assert browser.find_all("#routing-heatmap") == []
    finally:
        for s in served:
            s.stop()
        browser.close()
