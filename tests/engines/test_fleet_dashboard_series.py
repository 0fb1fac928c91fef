"""Review N24: the fleet dashboard's "refused" line of "seconds per weight update" showed No data on
a healthy run (a labelled counter has no series before its first increment), and its `__inputs`
declared a data source no panel used. Each source's failure counter is exposed at 0 from the start,
and the file declares nothing it does not use."""
from __future__ import annotations

import json
import re
from pathlib import Path

from miles.engines.metrics import WEIGHT_UPDATE_SOURCES, EngineMetrics

ROOT = Path(__file__).parents[2]


def test_every_weight_update_source_has_a_failure_series_at_zero():
    text = EngineMetrics(model_name="tiny").render().decode()
    for source in WEIGHT_UPDATE_SOURCES:
        assert f'miles_engine_weight_update_failures_total{{source="{source}"}} 0.0' in text


def test_the_sources_are_the_ones_the_server_labels():
    server = (ROOT / "miles/engines/server.py").read_text()
    used = set(re.findall(r"weight_update_(?:failures|seconds)\.labels\(\"(\w+)\"\)", server))
    assert used and used == set(WEIGHT_UPDATE_SOURCES)


def test_the_dashboard_declares_no_unused_input():
    raw = (ROOT / "deployments/grafana/miles-fleet.json").read_text()
    for declared in json.loads(raw).get("__inputs", []):
        assert raw.count("${" + declared["name"] + "}"), \
            f"{declared['name']} is declared but no panel uses it"
