"""Probes E2-E7, E15: a bad request gets a 400 of its own and never takes its batch down."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.engines import queued
from tests.support.wait import wait_for

from .probes import AUTH, MAX_BATCH, generate

BAD_IN_A_BATCH = [{"seed": 2**70}, {"min_new_tokens": 5, "stop_token_ids": [99_999_999]}]


@pytest.mark.parametrize("bad", BAD_IN_A_BATCH)
def test_one_bad_request_fails_alone_among_concurrent_ones(engine, bad):
    url = engine.url
    with ThreadPoolExecutor(30) as pool:
        httpx.post(url + "/pause_generation", headers=AUTH).raise_for_status()  # so they all share one batch
        try:
            futures = [pool.submit(generate, url, max_new_tokens=4, **(bad if i == 7 else {})) for i in range(30)]
            with httpx.Client(base_url=url) as control:
                wait_for(lambda: queued(control) >= 29, 60, "29 queued requests", interval=0.02)
        finally:
            httpx.post(url + "/continue_generation", headers=AUTH).raise_for_status()
        answers = [f.result() for f in futures]
    assert answers[7].status_code == 400
    others = [a for i, a in enumerate(answers) if i != 7]
    assert all(a.status_code == 200 for a in others)
    assert all(a.json()["meta_info"]["finish_reason"]["type"] != "abort" for a in others)
    assert MAX_BATCH >= 29


def test_a_row_that_fails_inside_the_batch_is_retried_alone(engine):
    """Requests that pass validation but break decoding only take themselves down (the scheduler retries
    the rest of the admitted group row by row). Driven in process: no valid request breaks decoding on purpose."""
    from miles.engines.sglang_request import SamplingParams
    from miles.engines.scheduler import EngineRequest, FinishEvent, Scheduler

    class Runner:  # the smallest runner whose prefill fails for one poisoned prompt
        tokenizer = type("T", (), {"from_pretrained": staticmethod(lambda path: None)})()
        model_path, device, eos_ids = "x", "cpu", (0,)

    events: dict[str, FinishEvent] = {}
    scheduler = Scheduler.__new__(Scheduler)
    ran: list[list[str]] = []

    def admit(batch):  # the prefill of an admitted group
        ran.append([r.rid for r in batch])
        if any(r.rid == "poison" for r in batch):
            raise RuntimeError("boom")
        for r in batch:
            scheduler._finish(r, __import__("miles.engines.sglang_request", fromlist=["FinishReason"]).FinishReason("stop"))
        return len(batch)
    scheduler._admit = admit
    scheduler.metrics = type("M", (), {"record_finish": lambda *a: None})()
    scheduler.weight_version = "v"
    batch = [EngineRequest(rid=rid, prompt_ids=[1], params=SamplingParams(), sink=lambda e, rid=rid: events.update(
        {rid: e})) for rid in ("a", "poison", "b")]
    Scheduler._admit_safely(scheduler, batch)
    assert ran == [["a", "poison", "b"], ["a"], ["poison"], ["b"]]
    assert {rid: e.result.finish_reason.type for rid, e in events.items()} == {"a": "stop", "poison": "abort",
                                                                                "b": "stop"}


@pytest.mark.parametrize("body, param", [
    ('{"text": "1+1=", "sampling_params": {"temperature": NaN}}', "temperature"),
    ('{"text": "1+1=", "sampling_params": {"temperature": Infinity}}', "temperature"),
    ('{"text": "1+1=", "sampling_params": {"top_p": NaN}}', "top_p"),
    ('{"text": "1+1=", "sampling_params": {"logit_bias": {"5": 100}}}', "logit_bias"),
    ('{"text": "\\ud800abc"}', "text"),
    ('[' * 100_000 + ']' * 100_000, None),
])
def test_odd_inputs_are_400_naming_the_field(engine, body, param):
    r = httpx.post(engine.url + "/generate", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_truncated_weights_file_is_a_400_and_changes_nothing(engine, untrained_model, tmp_path):
    import shutil

    bad = tmp_path / "trunc"
    shutil.copytree(untrained_model, bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = httpx.get(engine.url + "/get_weight_version").json()
    r = httpx.post(engine.url + "/update_weights_from_disk", headers=AUTH, timeout=60,
                   json={"model_path": str(bad), "weight_version": "trunc"})
    assert r.status_code == 400 and "safetensors" in r.json()["message"]
    (bad / "config.json").write_text("{not json")
    r = httpx.post(engine.url + "/update_weights_from_disk", headers=AUTH, timeout=60,
                   json={"model_path": str(bad), "weight_version": "trunc"})
    assert r.status_code == 400 and "config.json" in r.json()["message"]
    assert httpx.get(engine.url + "/get_weight_version").json() == before
