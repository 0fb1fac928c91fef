"""The proxy over real loopback HTTP: methods, streaming, 4xx pass-through, 5xx failover, no worker."""
from __future__ import annotations

import json

import httpx
import pytest

from miles.router.proxy import MAX_BACKOFF_S, Proxy

from tests.support.wait import wait_for


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
def test_every_method_path_query_header_and_body_reaches_the_worker(stubs, router, method):
    stub = stubs()
    handle = router([stub.url])
    body = b'{"x": 1}' if method in ("POST", "PUT") else b""
    r = httpx.request(method, handle.url + "/echo?a=1&b=two", content=body, headers={"x-trace": "abc"})
    assert r.status_code == 200
    seen = r.json()
    assert seen["method"] == method and seen["query"] == "a=1&b=two"
    assert seen["body"] == body.decode() and seen["headers"]["x-trace"] == "abc"
    assert seen["headers"]["host"] == f"127.0.0.1:{stub.port}"


def test_generate_answer_passes_through_unchanged(stubs, router):
    stub = stubs("--weight-version", "v7")
    handle = router([stub.url])
    direct = httpx.post(stub.url + "/generate", json={"text": "1+1="})
    routed = httpx.post(handle.url + "/generate", json={"text": "1+1="})
    assert routed.status_code == 200 and routed.content == direct.content
    assert routed.headers["content-type"] == "application/json"


def test_streaming_delivers_every_chunk_in_order_as_it_arrives(stubs, router):
    stub = stubs("--stream-gap", "0.05")
    handle = router([stub.url])
    events = []
    with httpx.stream("POST", handle.url + "/generate", json={"stream": True, "chunks": 20}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        assert "content-length" not in r.headers  # relayed as it comes, not buffered whole
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["index"] for e in events[:-1]] == list(range(20))


def test_a_4xx_passes_through_and_never_counts_against_the_worker(stubs, router):
    bad = stubs("--generate-status", "400")
    handle = router([bad.url], rollout_health_check_interval=0.05, miles_router_health_check_failure_threshold=1)
    for _ in range(20):
        r = httpx.post(handle.url + "/generate", json={})
        assert r.status_code == 400 and r.json() == {"error": "stub told to fail"}
    rounds = handle.router.health.rounds
    wait_for(lambda: handle.router.health.rounds >= rounds + 3, 30, "three more health-check rounds")
    worker = httpx.get(handle.url + "/workers").json()["workers"][0]
    assert worker["state"] == "healthy" and worker["errors"] == 0 and worker["requests"] == 20
    stats = handle.stats()
    assert stats["router_errors"] == 0 and stats["router_retries"] == 0


def test_a_5xx_is_retried_on_another_worker(stubs, router):
    broken = stubs("--generate-status", "500")
    good = stubs()
    handle = router([broken.url, good.url], router_policy="round-robin", router_retry_backoff=0.001)
    for _ in range(10):
        r = httpx.post(handle.url + "/generate", json={})
        assert r.status_code == 200 and r.json()["text"] == "42"
    stats = handle.stats()
    assert stats["router_errors"] == 0 and stats["router_retries"] == 5  # round robin: every other one
    workers = {w["url"]: w for w in httpx.get(handle.url + "/workers").json()["workers"]}
    assert workers[broken.url]["errors"] == 5 and workers[good.url]["errors"] == 0


def test_a_5xx_with_no_retry_left_passes_through_as_a_failure(stubs, router):
    broken = stubs("--generate-status", "503")
    handle = router([broken.url], router_max_retries=0)
    r = httpx.post(handle.url + "/generate", json={})
    assert r.status_code == 503 and r.json() == {"error": "stub told to fail"}
    assert handle.stats()["router_errors"] == 1


def test_unreachable_workers_give_502_after_bounded_retries(stubs, router):
    dead = stubs()
    dead.kill()
    handle = router([dead.url], router_max_retries=2, router_retry_backoff=0.001,
                    disable_rollout_health_check=True)
    r = httpx.post(handle.url + "/generate", json={})
    assert r.status_code == 502
    assert "after 3 attempts" in r.json()["error"] and dead.url in r.json()["last_error"]
    assert handle.stats()["router_retries"] == 2


def test_no_healthy_worker_is_a_503_json_error(router):
    handle = router([])
    r = httpx.post(handle.url + "/generate", json={})
    assert r.status_code == 503 and "none registered" in r.json()["error"]
    assert handle.stats()["router_no_worker"] == 1


def test_health_is_proxied_to_a_worker(stubs, router):
    stub = stubs()
    handle = router([stub.url])
    assert httpx.get(handle.url + "/health").status_code == 200
    assert httpx.get(handle.url + "/no/such/path").json()["error"].startswith("stub has no GET")


def test_head_requests_end_at_the_headers(stubs, router):
    stub = stubs()
    handle = router([stub.url])
    for _ in range(3):  # the connection is not reused after a HEAD, so each one must still work
        r = httpx.head(handle.url + "/get_server_info", timeout=10)
        assert r.status_code == 200 and r.content == b""
    assert httpx.get(handle.url + "/get_server_info").json()["weight_version"] == "default"


def test_backoff_is_exponential_capped_and_jittered():
    proxy = Proxy(None, None, None, max_retries=5, retry_backoff=0.1, request_timeout=1)
    for retry, base in ((1, 0.1), (2, 0.2), (3, 0.4), (10, MAX_BACKOFF_S)):
        delays = [proxy.backoff(retry) for _ in range(200)]
        assert all(0.5 * base <= d <= 1.5 * base for d in delays)
        assert len(set(delays)) > 100  # jittered, not a fixed step
