"""Probe H1: what a web page in the user's browser can send to the loopback servers.

A "simple" cross-origin request (foreign `Origin`, `Content-Type: text/plain`, no preflight) and a
DNS-rebound one (`Host: evil.example`) are refused with a 403 by the engine, the router and the
dashboard; our own clients (httpx: no Origin, a loopback Host) and same-origin pages still work.
"""
from __future__ import annotations

import httpx
import pytest

from .probes import AUTH
from tests.support.dashboard import serve_dashboard

EVIL = {"Origin": "http://evil.example", "Content-Type": "text/plain"}


def test_router_refuses_a_cross_site_add_worker_and_keeps_its_workers(router):
    handle = router(token=None)  # the loopback default: no token
    port = handle.url.rsplit(":", 1)[1]
    before = httpx.get(handle.url + "/list_workers").json()
    for headers in (EVIL, {**EVIL, "Host": f"evil.example:{port}"}, {"Sec-Fetch-Site": "cross-site"}):
        answer = httpx.post(handle.url + "/add_worker", headers=headers, content='{"url":"http://127.0.0.1:31999"}')
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]
    assert httpx.get(handle.url + "/list_workers").json() == before
    # the same request from a script (no Origin) still works, and so does a same-origin page
    own = httpx.post(handle.url + "/add_worker", json={"url": "http://127.0.0.1:31999"},
                     headers={"Origin": f"http://127.0.0.1:{port}"})
    assert own.status_code == 200, own.text
    assert httpx.post(handle.url + "/remove_worker", json={"url": "http://127.0.0.1:31999"}).status_code == 200


def test_router_refuses_a_rebound_host_even_for_reads(router):
    handle = router(token=None)
    port = handle.url.rsplit(":", 1)[1]
    answer = httpx.get(handle.url + "/list_workers", headers={"Host": f"evil.example:{port}"})
    assert answer.status_code == 403 and "Host" in answer.json()["error"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"127.0.0.2:{port}"):
        assert httpx.get(handle.url + "/list_workers", headers={"Host": host}).status_code == 200
    # a rebound page cannot read an engine through the router either
    assert httpx.get(handle.url + "/get_server_info", headers={"Host": "evil.example"}).status_code == 403


def test_router_refuses_cross_site_engine_admin_calls(router):
    handle = router(token=None)
    answer = httpx.post(handle.url + "/pause_generation", headers=EVIL, content="{}")
    assert answer.status_code == 403, answer.text
    # a GET that changes state (resets the counters) from another site
    assert httpx.get(handle.url + "/router_stats", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403


@pytest.mark.parametrize("path,body", [
    ("/update_weights_from_disk", '{"model_path": "/nonexistent-probe"}'),
    ("/abort_request", '{"rid": "no-such-request"}'),
    ("/pause_generation", "{}"),
])
def test_engine_refuses_cross_site_admin_calls_even_with_the_token(engine, path, body):
    # with the token a script gets through; a page cannot hold it, but the Origin rule holds on its own
    answer = httpx.post(engine.url + path, headers={**EVIL, **AUTH}, content=body, timeout=60)
    assert answer.status_code == 403, answer.text
    assert "Origin" in answer.json()["error"]


def test_engine_refuses_a_rebound_host_and_cross_site_admin_gets(engine):
    assert httpx.get(engine.url + "/get_server_info", headers={"Host": "evil.example:30000"}).status_code == 403
    assert httpx.get(engine.url + "/flush_cache", headers={**AUTH, "Sec-Fetch-Site": "cross-site"}).status_code == 403
    # our own clients: no Origin, loopback Host
    assert httpx.get(engine.url + "/get_server_info").status_code == 200
    assert httpx.get(engine.url + "/flush_cache", headers=AUTH).status_code == 200
    answer = httpx.post(engine.url + "/generate", json={"text": "1+1=", "sampling_params": {"max_new_tokens": 1}},
                        timeout=120)
    assert answer.status_code == 200, answer.text
    # a cross-site POST to /generate (no preflight needed) is refused as well
    foreign = httpx.post(engine.url + "/generate", headers=EVIL, timeout=60,
                         content='{"text": "1+1=", "sampling_params": {"max_new_tokens": 1}}')
    assert foreign.status_code == 403


def test_dashboard_refuses_a_rebound_host(tmp_path):
    served = serve_dashboard(tmp_path)
    try:
        port = served.url.rsplit(":", 1)[1]
        assert httpx.get(served.url + "/api/run", headers={"Host": f"evil.example:{port}"}).status_code == 403
        assert httpx.get(served.url + "/", headers={"Host": f"evil.example:{port}"}).status_code == 403
        assert httpx.get(served.url + "/api/run").status_code == 200
        assert httpx.get(served.url + "/api/run", headers={"Host": f"localhost:{port}"}).status_code == 200
    finally:
        served.stop()
