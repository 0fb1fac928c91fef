"""SGLang's /pause_generation modes on the embedded engine, driven in process on the real model runner:
`in_place` freezes a running request with its cache and `retract` puts it back in the queue; a weight
swap then runs with the request in flight, the request goes on under the new version after continue, and
every token carries the version that sampled it. The pause is asked for from the request's own sink (on
the scheduler thread, between two steps), so nothing depends on timing.
"""
from __future__ import annotations

import pytest

from miles.engines.sglang_request import RequestError
from tests.support.in_process_engine import TIMEOUT_S, Tracked, alone, params, prompt

PAUSE_AT = 10
LENGTH = 30


def swap_version_mid_request(scheduler, runner, mode: str, seed: int):
    """Pause in `mode` at the request's PAUSE_AT-th token, swap the weight version while it is in flight,
    continue; returns (the result, the scheduler stats while paused, the number of requests paused)."""
    paused = {}
    request = Tracked(scheduler, f"{mode}-1", prompt(runner, "12+34="), params(LENGTH, seed=seed))
    request.on_token(PAUSE_AT, lambda: paused.setdefault("future", scheduler.pause(mode)))
    request.submit()
    count = _wait(lambda: paused.get("future"))
    n_paused = count.result(timeout=TIMEOUT_S)
    # the swap runs while the request is in flight (without a pause mode it would wait for it to end)
    scheduler.call_between_batches(lambda: setattr(scheduler, "weight_version", "v2")).result(timeout=TIMEOUT_S)
    stats = scheduler.stats()
    assert not request.done.done(), "the request ended before the swap"
    scheduler.set_paused(False)
    try:
        return request.result(), stats, n_paused
    finally:
        scheduler.call_between_batches(lambda: setattr(scheduler, "weight_version", "v1")).result(timeout=TIMEOUT_S)


def _wait(get):
    import time

    deadline = time.monotonic() + TIMEOUT_S
    while (value := get()) is None:
        assert time.monotonic() < deadline, "the pause was never asked for"
        time.sleep(0.01)
    return value


def test_in_place_keeps_the_request_running_across_a_weight_swap(scheduler, runner):
    result, stats, n_paused = swap_version_mid_request(scheduler, runner, "in_place", seed=7)
    assert n_paused == 1 and stats.num_running_reqs == 1 and stats.paused
    assert result.finish_reason.type == "length" and len(result.output_ids) == LENGTH
    assert result.output_versions == ["v1"] * PAUSE_AT + ["v2"] * (LENGTH - PAUSE_AT)
    assert result.weight_version == "v1"  # the version it was admitted under, as SGLang reports it
    # same weights under both versions and the cache kept: exactly the tokens of an uninterrupted run
    assert result.output_ids == alone(scheduler, "in_place-2", prompt(runner, "12+34="),
                                      params(LENGTH, seed=7)).output_ids


def test_retract_requeues_the_request_and_it_resumes_where_it_stopped(scheduler, runner):
    result, stats, n_paused = swap_version_mid_request(scheduler, runner, "retract", seed=9)
    assert n_paused == 1 and stats.num_running_reqs == 0 and stats.num_queue_reqs == 1
    assert result.finish_reason.type == "length" and len(result.output_ids) == LENGTH
    assert result.output_versions == ["v1"] * PAUSE_AT + ["v2"] * (LENGTH - PAUSE_AT)


def test_an_unknown_pause_mode_is_refused(scheduler):
    with pytest.raises(RequestError, match="mode must be one of abort, retract, in_place"):
        scheduler.pause("sideways")
    assert not scheduler.stats().paused


def test_the_http_pause_takes_sglang_modes(client):
    bad = client.post("/pause_generation", json={"mode": "sideways"})
    assert bad.status_code == 400 and "mode must be one of" in bad.text
    try:
        answer = client.post("/pause_generation", json={"mode": "in_place"}).raise_for_status().json()
        assert answer["success"] and answer["num_paused_requests"] == 0
        assert client.get("/get_server_info").json()["paused"] is True
    finally:
        client.post("/continue_generation", json={}).raise_for_status()
    reply = client.post("/generate", json={"text": "1+1=", "return_logprob": True,
                                           "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}).json()
    versions = reply["meta_info"]["output_token_weight_versions"]
    assert versions == [reply["meta_info"]["weight_version"]] * 3
