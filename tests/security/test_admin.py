"""Probes R14-R16: the engines' state-changing endpoints need the admin token, through the router and direct."""
from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from .probes import AUTH, generate

ENGINE_ADMIN = [("/pause_generation", None), ("/continue_generation", None), ("/flush_cache", None),
                ("/abort_request", {"abort_all": True}),
                ("/update_weights_from_disk", {"model_path": "/nonexistent", "weight_version": "pwned"})]


@pytest.mark.parametrize("path, body", ENGINE_ADMIN)
def test_engine_admin_endpoints_need_the_token_through_the_router(router, path, body):
    url = router().url
    r = httpx.post(url + path, json=body)
    assert r.status_code == 401 and "token" in r.json()["error"]
    wrong = httpx.post(url + path, json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = httpx.post(url + path, json=body, headers=AUTH)
    assert ok.status_code in (200, 400), ok.text  # reached the engine (400: the bogus model_path)
    httpx.post(url + "/continue_generation", headers=AUTH).raise_for_status()


@pytest.mark.parametrize("path, body", ENGINE_ADMIN)
def test_engine_admin_endpoints_need_the_token_direct(engine, path, body):
    r = httpx.post(engine.url + path, json=body)
    assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"


def test_generation_and_reads_stay_open(engine, router):
    url = router().url
    assert generate(url).status_code == 200
    for path in ("/health", "/get_model_info", "/get_server_info", "/get_weight_version", "/list_workers",
                 "/workers", "/router_health", "/metrics"):
        assert httpx.get(url + path, timeout=60).status_code == 200, path
    assert generate(engine.url).status_code == 200
    # the zeroed-weights attack of R14 left the served version alone
    assert httpx.get(engine.url + "/get_weight_version").json()["weight_version"] != "pwned"


def test_router_stats_reset_needs_the_token(router):
    url = router().url
    assert httpx.get(url + "/router_stats", params={"reset": "false"}).status_code == 200
    assert httpx.get(url + "/router_stats").status_code == 401
    assert httpx.get(url + "/router_stats", headers=AUTH).status_code == 200


def test_without_a_token_on_loopback_everything_stays_open(router):
    url = router(token=None).url
    assert httpx.post(url + "/continue_generation").status_code == 401  # the engine keeps its own token


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_engine_refuses_to_bind_off_loopback_without_a_token(host):
    done = subprocess.run([sys.executable, "-m", "miles.engines.cli", "--host", host, "--port", "0"],
                          capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in __import__("os").environ.items()
                               if k != "MILES_ENGINE_ADMIN_TOKEN"})
    assert done.returncode == 2
    assert "--engine-admin-token" in done.stderr and "Traceback" not in done.stderr
