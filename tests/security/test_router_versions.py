"""N7: a weight_version the router cannot store or echo (a lone surrogate, a 1 MiB string) is a 400 on
/update_weight_version, /set_worker_state and /add_worker, not a 500; the stored version is kept."""
from __future__ import annotations

import json

import httpx
import pytest

from miles.config import RouterConfig
from miles.router import start_router

SURROGATE = '"\\ud800"'  # JSON text: decodes to a Python str no UTF-8 encoder takes


@pytest.fixture
def bare_router():
    handle = start_router(RouterConfig(), worker_urls=[])
    yield handle
    handle.stop()


def post_raw(url: str, body: str) -> httpx.Response:
    return httpx.post(url, content=body.encode(), headers={"content-type": "application/json"}, timeout=30)


@pytest.mark.parametrize("version, message", [(SURROGATE, "not valid Unicode"),
                                              (json.dumps("v" * (1 << 20)), "characters long; at most 256")])
def test_a_version_the_router_cannot_keep_is_a_400(bare_router, version, message):
    url = bare_router.url
    post_raw(url + "/update_weight_version", '{"weight_version": "7"}').raise_for_status()
    answer = post_raw(url + "/update_weight_version", '{"weight_version": %s}' % version)
    assert answer.status_code == 400 and message in answer.text
    added = post_raw(url + "/add_worker", '{"url": "http://127.0.0.1:9", "state": "stale", "weight_version": %s}'
                     % version)
    assert added.status_code == 400 and message in added.text
    post_raw(url + "/add_worker", '{"url": "http://127.0.0.1:9", "state": "stale"}').raise_for_status()
    admit = post_raw(url + "/set_worker_state",
                     '{"url": "http://127.0.0.1:9", "state": "healthy", "weight_version": %s}' % version)
    assert admit.status_code == 400 and message in admit.text
    assert httpx.get(url + "/router_health", timeout=30).json()["weight_version"] == "7"  # kept
    assert [w["weight_version"] for w in httpx.get(url + "/list_workers", timeout=30).json()["workers"]] == [None]
