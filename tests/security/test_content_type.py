"""The JSON content-type rule (miles/serving/content_type.py): a POST with a body of a type a web page
can send across sites without a preflight (`text/plain`, `multipart/form-data`) is a 415 at the engine,
the router and the dashboard, even without an Origin; our own clients (application/json, the
octet-stream weight push) and curl's `-d` (form-urlencoded, no Origin) still get through."""
from __future__ import annotations

import httpx
import pytest

from miles.serving.content_type import content_type_refusal

from .probes import AUTH
from tests.support.dashboard import serve_dashboard

GENERATE = '{"text": "1+1=", "sampling_params": {"max_new_tokens": 1}}'


@pytest.mark.parametrize("headers, refused", [
    ({"content-type": "application/json", "content-length": "2"}, False),
    ({"content-type": "Application/JSON; charset=utf-8", "content-length": "2"}, False),
    ({"content-type": "application/vnd.api+json", "content-length": "2"}, False),
    ({"content-type": "text/plain", "content-length": "2"}, True),
    ({"content-type": "text/plain;charset=UTF-8", "content-length": "2", "origin": "http://evil.example"}, True),
    ({"content-type": "multipart/form-data; boundary=x", "content-length": "2"}, True),
    ({"content-type": "application/x-www-form-urlencoded", "content-length": "2"}, False),  # curl -d
    ({"content-type": "application/x-www-form-urlencoded", "content-length": "2", "sec-fetch-site": "cross-site"},
     True),
    ({"content-length": "2"}, False),  # a script's untyped body
    ({"content-length": "2", "origin": "http://127.0.0.1:1"}, True),  # a page's untyped Blob
    ({"content-type": "text/plain", "content-length": "0"}, False),  # no body: /pause_generation
    ({"content-type": "text/plain"}, False),
    ({"content-type": "text/plain", "transfer-encoding": "chunked"}, True),
])
def test_the_rule(headers, refused):
    assert (content_type_refusal(headers, "POST", "/generate") is not None) == refused
    assert content_type_refusal(headers, "GET", "/generate") is None


def test_the_weight_push_takes_octet_stream_only_there():
    binary = {"content-type": "application/octet-stream", "content-length": "10"}
    assert content_type_refusal(binary, "POST", "/update_weights_from_tensor") is None
    assert "application/json" in content_type_refusal(binary, "POST", "/generate")


def test_engine_refuses_text_plain(engine):
    answer = httpx.post(engine.url + "/generate", content=GENERATE, headers={"Content-Type": "text/plain"}, timeout=60)
    assert answer.status_code == 415 and "Content-Type 'text/plain'" in answer.json()["error"]
    answer = httpx.post(engine.url + "/pause_generation", content="{}", headers={**AUTH, "Content-Type": "text/plain"})
    assert answer.status_code == 415
    assert httpx.post(engine.url + "/generate", content=GENERATE, timeout=120,
                      headers={"Content-Type": "application/x-www-form-urlencoded"}).status_code == 200  # curl -d
    assert httpx.post(engine.url + "/generate", content=GENERATE, timeout=120,
                      headers={"Content-Type": "application/json"}).status_code == 200
    # the weight push's octet-stream passes the rule (then the engine checks the token)
    pushed = httpx.post(engine.url + "/update_weights_from_tensor", content=b"x" * 10,
                        headers={"Content-Type": "application/octet-stream"})
    assert pushed.status_code == 401


def test_router_refuses_text_plain_for_itself_and_its_engines(router):
    handle = router(token=None)
    before = httpx.get(handle.url + "/list_workers").json()
    answer = httpx.post(handle.url + "/add_worker", content='{"url": "http://127.0.0.1:31999"}',
                        headers={"Content-Type": "text/plain"})
    assert answer.status_code == 415, answer.text
    assert httpx.get(handle.url + "/list_workers").json() == before
    proxied = httpx.post(handle.url + "/generate", content=GENERATE, headers={"Content-Type": "text/plain"},
                         timeout=60)
    assert proxied.status_code == 415
    assert httpx.post(handle.url + "/generate", content=GENERATE, timeout=120,
                      headers={"Content-Type": "application/json"}).status_code == 200


def test_dashboard_refuses_text_plain(tmp_path):
    served = serve_dashboard(tmp_path)
    try:
        answer = httpx.post(served.url + "/api/run", content="{}", headers={"Content-Type": "text/plain"})
        assert answer.status_code == 415
    finally:
        served.stop()
