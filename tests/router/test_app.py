"""The router's own endpoints over HTTP: Miles' add/list contract, bad admin input, token rule, stats, metrics."""
from __future__ import annotations

import httpx
import pytest

from miles.config import ConfigError, RouterConfig
from miles.router import start_router
from miles.router.app import TOKEN_ENV, check_bind

from tests.support.wait import wait_for


def test_add_worker_by_query_or_json_and_list_them(stubs, router):
    a, b = stubs(), stubs()
    handle = router([])
    r = httpx.post(handle.url + "/add_worker", params={"url": a.url})
    assert r.status_code == 200 and r.json() == {"status": "success", "worker_urls": {a.url: 0}}
    r = httpx.post(handle.url + "/add_worker", json={"url": b.url})
    assert r.status_code == 200 and set(r.json()["worker_urls"]) == {a.url, b.url}
    listed = httpx.get(handle.url + "/list_workers").json()
    assert listed["urls"] == [a.url, b.url]
    assert listed["workers"] == [{"url": u, "state": "healthy", "weight_version": None} for u in (a.url, b.url)]
    assert httpx.post(handle.url + "/generate", json={}).status_code == 200


@pytest.mark.parametrize("kwargs, status, message", [
    ({}, 400, "worker url is required"),
    ({"json": {"name": "x"}}, 400, "worker url is required"),
    ({"content": b"{not json"}, 400, "not valid JSON"),
    ({"json": ["http://127.0.0.1:1"]}, 400, "must be a JSON object"),
    ({"params": {"url": "ftp://127.0.0.1:1"}}, 400, "not an http(s) URL"),
    ({"json": {"url": 5}}, 400, "non-empty string"),
])
def test_bad_add_worker_input_is_a_clear_4xx(router, kwargs, status, message):
    handle = router([])
    r = httpx.post(handle.url + "/add_worker", **kwargs)
    assert r.status_code == status and message in r.json()["error"]
    assert httpx.get(handle.url + "/list_workers").json()["urls"] == []


def test_duplicate_add_and_unknown_remove(stubs, router):
    stub = stubs()
    handle = router([stub.url])
    r = httpx.post(handle.url + "/add_worker", params={"url": stub.url})
    assert r.status_code == 409 and "already registered" in r.json()["error"]
    r = httpx.post(handle.url + "/remove_worker", params={"url": "http://127.0.0.1:1"})
    assert r.status_code == 404 and "not registered" in r.json()["error"]
    r = httpx.post(handle.url + "/remove_worker", json={"url": stub.url})
    assert r.status_code == 200 and r.json()["worker_urls"] == []
    assert httpx.post(handle.url + "/generate", json={}).status_code == 503


def test_weight_version_updates_and_bad_bodies(router):
    handle = router([])
    r = httpx.post(handle.url + "/update_weight_version", json={"weight_version": "3"})
    assert r.json() == {"status": "success", "weight_version": "3"}
    assert httpx.get(handle.url + "/workers").json()["weight_version"] == "3"
    assert httpx.get(handle.url + "/router_health").json()["weight_version"] == "3"
    for body in ({}, {"weight_version": None}, {"weight_version": ""}, {"weight_version": {"a": 1}}):
        r = httpx.post(handle.url + "/update_weight_version", json=body)
        assert r.status_code == 400 and "weight_version" in r.json()["error"]


def test_token_guards_admin_endpoints_only(stubs, router):
    stub = stubs()
    handle = router([], router_admin_token="s3cret")
    for path, body in (("/add_worker", {"url": stub.url}), ("/remove_worker", {"url": stub.url}),
                       ("/update_weight_version", {"weight_version": "1"})):
        assert httpx.post(handle.url + path, json=body).status_code == 401
        wrong = httpx.post(handle.url + path, json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "s3cret" not in wrong.text
    ok = httpx.post(handle.url + "/add_worker", json={"url": stub.url}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert httpx.get(handle.url + "/list_workers").status_code == 200  # reads stay open
    assert httpx.post(handle.url + "/generate", json={}).status_code == 200


def test_non_loopback_bind_needs_a_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ConfigError, match="--router-admin-token"):
        check_bind("0.0.0.0", None)
    with pytest.raises(ConfigError, match="--router-admin-token"):
        start_router(RouterConfig(), host="0.0.0.0")
    check_bind("0.0.0.0", "token")
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("localhost", None)


def test_token_comes_from_the_environment(monkeypatch, stubs):
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    stub = stubs()
    handle = start_router(RouterConfig())
    try:
        assert httpx.post(handle.url + "/add_worker", json={"url": stub.url}).status_code == 401
        r = httpx.post(handle.url + "/add_worker", json={"url": stub.url}, headers={"X-Admin-Token": "from-env"})
        assert r.status_code == 200
    finally:
        handle.stop()


def test_router_stats_endpoint_and_python_snapshot_share_one_window(stubs, router):
    stub = stubs()
    handle = router([stub.url])
    for _ in range(5):
        httpx.post(handle.url + "/generate", json={})
    peek = httpx.get(handle.url + "/router_stats", params={"reset": "false"}).json()
    assert peek["router_requests"] == 5
    taken = httpx.get(handle.url + "/router_stats").json()
    assert taken["router_requests"] == 5 and taken["router_healthy_workers"] == 1
    assert taken["router_latency_p50_ms"] > 0 and taken["router_latency_p99_ms"] >= taken["router_latency_p50_ms"]
    httpx.post(handle.url + "/generate", json={})
    assert handle.stats()["router_requests"] == 1


def test_prometheus_metrics(stubs, router):
    stub = stubs()
    handle = router([stub.url])
    for _ in range(3):
        httpx.post(handle.url + "/generate", json={})
    r = httpx.get(handle.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert "miles_router_requests_total 3.0" in text
    assert f'miles_router_worker_requests_total{{worker="{stub.url}"}} 3.0' in text
    assert f'miles_router_worker_healthy{{worker="{stub.url}"}} 1.0' in text
    assert f'miles_router_worker_request_duration_seconds_count{{worker="{stub.url}"}} 3.0' in text
    assert "miles_router_retries_total 0.0" in text and "miles_router_inflight 0.0" in text


def test_workers_endpoint_describes_each_worker(stubs, router):
    stub = stubs("--weight-version", "v1")
    handle = router([stub.url], rollout_health_check_interval=0.05)
    httpx.post(handle.url + "/generate", json={})
    def described():
        worker = httpx.get(handle.url + "/workers").json()["workers"][0]
        return worker if worker["weight_version"] == "v1" else None
    worker = wait_for(described, 30, "the health loop to read the weight version")
    assert worker["url"] == stub.url and worker["state"] == "healthy" and worker["requests"] == 1
    assert worker["inflight"] == 0 and worker["errors"] == 0 and worker["consecutive_failures"] == 0


def test_stale_worker_gets_no_traffic_until_admitted_at_the_current_weight_version(stubs, router):
    a = stubs()
    handle = router([])
    httpx.post(handle.url + "/update_weight_version", json={"weight_version": "5"}).raise_for_status()
    r = httpx.post(handle.url + "/add_worker", json={"url": a.url, "state": "stale", "weight_version": "4"})
    assert r.status_code == 200
    assert httpx.get(handle.url + "/list_workers").json()["workers"] == [
        {"url": a.url, "state": "stale", "weight_version": "4"}]
    assert httpx.post(handle.url + "/generate", json={}).status_code == 503  # registered, but stale: no traffic
    r = httpx.post(handle.url + "/set_worker_state", json={"url": a.url, "state": "ready", "weight_version": "4"})
    assert r.status_code == 409 and "serves 5" in r.json()["error"]
    r = httpx.post(handle.url + "/set_worker_state", json={"url": a.url, "state": "ready", "weight_version": "5"})
    assert r.status_code == 200 and r.json()["state"] == "healthy"
    assert httpx.post(handle.url + "/generate", json={}).status_code == 200
    r = httpx.post(handle.url + "/set_worker_state", json={"url": a.url, "state": "stale"})
    assert r.status_code == 200 and r.json()["state"] == "stale"
    assert httpx.post(handle.url + "/generate", json={}).status_code == 503


@pytest.mark.parametrize("body, status, message", [
    ({"url": "http://127.0.0.1:1", "state": "stale"}, 404, "not registered"),
    ({"state": "ready"}, 400, "worker url is required"),
    ({"url": "U", "state": "asleep"}, 400, "state must be"),
    ({"url": "U", "state": "ready"}, 400, "needs the weight_version"),
])
def test_bad_set_worker_state_input_is_a_clear_4xx(stubs, router, body, status, message):
    a = stubs()
    handle = router([a.url])
    body = {k: (a.url if v == "U" else v) for k, v in body.items()}
    r = httpx.post(handle.url + "/set_worker_state", json=body)
    assert r.status_code == status and message in r.json()["error"]
