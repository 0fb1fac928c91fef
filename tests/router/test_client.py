"""`RouterClient` against a real router with an admin token: every admin call carries the token, an error
answer names the call, and it is the only caller of the router's state-changing endpoints."""
from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from miles.serving.router_client import RouterClient, RouterError
from miles.serving.process import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "client-token"
ADMIN_CALL = re.compile(r"""["'](/add_worker|/set_worker_state|/update_weight_version|/router_stats)["'?]""")


def workers(handle) -> dict[str, dict]:
    return {w["url"]: w for w in httpx.get(handle.url + "/list_workers").json()["workers"]}


def test_every_admin_call_carries_the_token(stubs, router):
    handle = router(router_admin_token=TOKEN)
    stub = stubs()
    client = RouterClient(handle.url, TOKEN)
    client.set_weight_version(4)
    client.add_worker(stub.url, ready=False)
    assert workers(handle)[stub.url]["state"] == "stale"
    client.admit(stub.url, 4)
    assert workers(handle)[stub.url] == {"url": stub.url, "state": "healthy", "weight_version": "4"}
    client.mark_stale(stub.url)
    assert workers(handle)[stub.url]["state"] == "stale"
    stats = client.take_stats()
    assert stats and all(type(v) is float for v in stats.values())


def test_without_the_token_the_router_refuses_and_the_error_names_the_call(stubs, router):
    handle = router(router_admin_token=TOKEN)
    for call in (lambda c: c.set_weight_version(1), lambda c: c.add_worker(stubs().url), lambda c: c.take_stats()):
        with pytest.raises(RouterError, match=r"answered HTTP 401"):
            call(RouterClient(handle.url, None))
        with pytest.raises(RouterError, match="401"):
            call(RouterClient(handle.url, "wrong"))
    assert workers(handle) == {}


def test_a_retried_registration_is_fine_only_when_asked(stubs, router):
    handle = router()
    stub = stubs()
    client = RouterClient(handle.url)
    client.add_worker(stub.url)
    client.add_worker(stub.url, exist_ok=True)
    with pytest.raises(RouterError, match=r"/add_worker answered HTTP 409"):
        client.add_worker(stub.url)


def test_an_unreachable_router_is_a_transport_error_after_the_patience():
    client = RouterClient(f"http://127.0.0.1:{free_port()}", TOKEN, timeout=2.0)
    with pytest.raises(httpx.TransportError):
        client.take_stats(patience=0.6)


def test_only_the_client_calls_the_admin_endpoints():
    """Outside the router itself, every add-worker, worker-state, weight-version and stats call goes through
    `RouterClient` (four modules called them by hand, each with its own error rule)."""
    callers = sorted({str(path.relative_to(ROOT)) for folder in ("miles", "flows", "tasks", "benchmarks")
                      for path in (ROOT / folder).rglob("*.py")
                      if ADMIN_CALL.search(path.read_text()) and "miles/router/" not in str(path)})
    assert callers == ["miles/serving/router_client.py"]
