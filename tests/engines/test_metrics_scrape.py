"""/metrics of a real engine and a real router in front of it, scraped after real requests and read with
prometheus_client's own parser: the histograms count exactly the requests served, agree with the
router's stats (what a run's journal records as rollout/router_*) and with the engine's answers."""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from miles.config import RouterConfig
from miles.router import start_router
from tests.support.metrics import check_histogram, histogram, scrape, value

ROOT = Path(__file__).resolve().parents[2]
REQUEST = {"text": "12+34=", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0.0}}


@pytest.fixture
def router_in_front(engine):
    handle = start_router(RouterConfig(), worker_urls=[engine.url])
    yield handle
    handle.stop()


def test_router_and_engine_histograms_count_the_requests_served(engine, router_in_front, base_model):
    router = router_in_front
    engine_before = scrape(engine.url)
    tokens = 0
    for _ in range(4):
        answer = httpx.post(router.url + "/generate", json=REQUEST, timeout=120)
        assert answer.status_code == 200
        tokens += answer.json()["meta_info"]["completion_tokens"]
    for _ in range(2):  # streamed: the router's first-chunk time is the client's time to first token
        with httpx.stream("POST", router.url + "/generate", json={**REQUEST, "stream": True}, timeout=120) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        tokens += events[-1]["meta_info"]["completion_tokens"]
    served = 6

    routed = scrape(router.url)
    stats = httpx.get(router.url + "/router_stats", params={"reset": "false"}).json()
    assert stats["router_requests"] == served  # what the trainer journals per rollout as rollout/router_requests
    assert value(routed, "miles_router_requests_total") == served
    for name in ("miles_router_request_duration_seconds", "miles_router_time_to_first_chunk_seconds"):
        buckets, count, total = histogram(routed, name)
        check_histogram(buckets, count)
        assert count == served and total > 0, name
    buckets, count, _ = histogram(routed, "miles_router_worker_request_duration_seconds", worker=engine.url)
    check_histogram(buckets, count)
    assert count == served
    assert value(routed, "miles_router_worker_breaker_state", worker=engine.url, state="closed") == 1
    assert value(routed, "miles_router_worker_breaker_state", worker=engine.url, state="open") == 0
    assert value(routed, "miles_router_worker_healthy", worker=engine.url) == 1
    # the first chunk comes no later than the last byte of the same requests
    assert histogram(routed, "miles_router_time_to_first_chunk_seconds")[2] <= \
        histogram(routed, "miles_router_request_duration_seconds")[2]

    engine_after = scrape(engine.url)
    model_label = {"model_name": next(dict(k)["model_name"] for n, k in engine_after if n == "sglang:num_requests_total")}

    def delta(name: str) -> float:
        return value(engine_after, name, **model_label) - value(engine_before, name, **model_label)
    assert delta("sglang:num_requests_total") == served
    assert delta("sglang:e2e_request_latency_seconds_count") == served
    assert delta("sglang:time_to_first_token_seconds_count") == served
    assert delta("sglang:generation_tokens_total") == tokens == served * 3
    assert delta("sglang:num_aborted_requests_total") == 0
    for name in ("sglang:e2e_request_latency_seconds", "sglang:time_to_first_token_seconds"):
        buckets, count, _ = histogram(engine_after, name, **model_label)
        check_histogram(buckets, count)
    for gauge in ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:gen_throughput"):
        assert (gauge, frozenset(model_label.items())) in engine_after, gauge


def test_weight_update_seconds_and_version_on_the_engine(engine, base_model, router_in_front):
    previous = httpx.get(engine.url + "/get_weight_version").json()["weight_version"]
    before = scrape(engine.url)
    try:
        r = httpx.post(engine.url + "/update_weights_from_disk",
                       json={"model_path": str(base_model), "weight_version": "7"}, timeout=120)
        assert r.json()["success"] is True
        after = scrape(engine.url)
    finally:  # the session's engine goes back to the version the other tests expect
        httpx.post(engine.url + "/update_weights_from_disk",
                   json={"model_path": str(base_model), "weight_version": previous}, timeout=120).raise_for_status()
    name = "miles_engine_weight_update_seconds"
    assert value(after, name + "_count", source="disk") - value(before, name + "_count", source="disk") == 1
    assert value(after, name + "_sum", source="disk") > value(before, name + "_sum", source="disk")
    assert value(after, "miles_engine_weight_version_info", weight_version="7") == 1
    assert value(after, "miles_engine_weight_version_number") == 7
    refused = httpx.post(engine.url + "/update_weights_from_disk", json={"model_path": "/no/such/dir"}, timeout=60)
    assert refused.json()["success"] is False
    served = scrape(engine.url)
    assert value(served, "miles_engine_weight_update_failures_total", source="disk") >= 1

    # every series the Grafana dashboard plots is one the router or an engine exposes
    names = {name for name, _ in served} | {name for name, _ in scrape(router_in_front.url)}
    dashboard = json.loads((ROOT / "deployments" / "grafana" / "miles-fleet.json").read_text())
    plotted = {m for panel in dashboard["panels"] for t in panel["targets"]
               for m in re.findall(r"(?:miles_\w+|sglang:\w+)", t["expr"])}
    assert len(plotted) >= 15 and plotted - names == set()


def test_metrics_keep_the_host_guard(engine, router_in_front):
    """/metrics is a read (open, no token) but, bound to loopback, answers only loopback Host names."""
    for url in (engine.url, router_in_front.url):
        assert httpx.get(url + "/metrics", headers={"Host": "evil.example"}).status_code == 403
        assert httpx.get(url + "/metrics").status_code == 200
