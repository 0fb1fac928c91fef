"""The rollout client's re-send (--use-fault-tolerance): a request no engine served (the router had no ready
worker) is sent again until one is admitted; without the flag, or past --engine-wait-timeout, it fails."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import httpx
import pytest

from miles.rollout.generate import GenerateError, take_resends

from tests.support.wait import wait_for

from .rollout_client import post_once


def test_a_request_waits_for_a_stale_worker_to_be_admitted(stubs, router):
    stub = stubs()
    handle = router([])
    httpx.post(handle.url + "/add_worker", json={"url": stub.url, "state": "stale"}).raise_for_status()
    take_resends()

    def admit_once_resent() -> None:  # once the client has been turned away twice
        wait_for(lambda: handle.stats(reset=False)["router_no_worker"] >= 2, 60, "two no-worker answers")
        httpx.post(handle.url + "/set_worker_state", json={"url": stub.url, "state": "ready",
                                                           "weight_version": "0"}).raise_for_status()
    admitter = threading.Thread(target=admit_once_resent)
    admitter.start()
    try:
        reply = post_once(handle.url, SimpleNamespace(use_fault_tolerance=True, engine_wait_timeout=60.0))
    finally:
        admitter.join(70)
    assert isinstance(reply, dict) and take_resends() >= 2


def test_without_fault_tolerance_or_past_the_wait_it_fails_naming_the_flag(stubs, router):
    stub = stubs()
    handle = router([])
    httpx.post(handle.url + "/add_worker", json={"url": stub.url, "state": "stale"}).raise_for_status()
    with pytest.raises(GenerateError, match="answered 503") as plain:
        post_once(handle.url, SimpleNamespace(use_fault_tolerance=False))
    assert "--engine-wait-timeout" not in str(plain.value)
    with pytest.raises(GenerateError, match="--engine-wait-timeout 1 s"):
        post_once(handle.url, SimpleNamespace(use_fault_tolerance=True, engine_wait_timeout=1.0))
