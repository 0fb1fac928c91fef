"""Probes E8/E9: bodies that cost the engine seconds to decode and check, and huge stop-string lists.

A 15 MB `input_ids` body (5M ids, under the 16 MiB body limit) used to be decoded and checked on the
engine's event loop (about 3 s each): /health stalled, and four at once got the only engine past the
router's health timeout. Now such a body is decoded off the loop and refused by its length first.
"""
from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from miles.engines.sglang_request import MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS

from .probes import generate

BIG_IDS = json.dumps({"input_ids": [5] * 5_000_000, "sampling_params": {"max_new_tokens": 4}}).encode()


def test_a_15mb_input_ids_body_is_a_400_and_health_answers_meanwhile(engine):
    assert 14 * 2**20 < len(BIG_IDS) < 16 * 2**20
    sent, answered = threading.Event(), threading.Event()
    result: dict = {}

    def body():
        for start in range(0, len(BIG_IDS), 1 << 20):
            yield BIG_IDS[start:start + (1 << 20)]
        sent.set()

    def big_request():
        try:
            result["answer"] = httpx.post(engine.url + "/generate", content=body(), timeout=300)
        finally:
            answered.set()

    worker = threading.Thread(target=big_request)
    worker.start()
    healthy_while_parsing = 0
    with httpx.Client(base_url=engine.url, timeout=120) as client:
        assert sent.wait(120), "the body was never sent"
        while not answered.is_set():
            response = client.get("/health")
            if not answered.is_set():  # answered while the big body was still being decoded and checked
                assert response.status_code == 200
                healthy_while_parsing += 1
    worker.join()
    # On the loop, the decode blocked every /health until the 400 was sent (at most the one or two that
    # slipped in while the last bytes were read); off the loop they keep being answered while it runs.
    assert healthy_while_parsing >= 5, healthy_while_parsing
    answer = result["answer"]
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "input_ids" and "context length" in error["message"]


def test_big_bodies_through_the_router_do_not_fail_a_health_check(engine, router):
    """The probe's case: several such bodies at once must not fail the router's health checks (default
    timeout, 5 s). A property check rather than a regression test: the in-process router shares this
    process with the clients, and on an idle machine the old on-loop decode also stayed under 5 s
    (4 at once: /health at most 1.48 s; the probe, on a loaded machine, saw 8.35 s)."""
    handle = router(rollout_health_check_interval=0.25)
    checks: list[bool] = []
    record = handle.router.pool.record_check

    def spy(worker, ok, weight_version):
        checks.append(ok)
        return record(worker, ok, weight_version)

    handle.router.pool.record_check = spy
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: httpx.post(handle.url + "/generate", content=BIG_IDS, timeout=300),
                                range(4)))
    assert [a.status_code for a in answers] == [400] * 4, [a.text[:200] for a in answers]
    assert checks, "no health check ran during the load"
    assert all(checks), f"{checks.count(False)} of {len(checks)} health checks failed under the load"
    assert generate(handle.url).status_code == 200


def test_stop_string_lists_are_bounded(engine):
    over = generate(engine.url, stop=[f"s{i:06d}" for i in range(MAX_STOP_STRINGS + 1)])
    assert over.status_code == 400 and "stop" in over.text and str(MAX_STOP_STRINGS) in over.text
    too_long = generate(engine.url, stop=["x" * (MAX_STOP_CHARS + 1)])
    assert too_long.status_code == 400 and str(MAX_STOP_CHARS) in too_long.text
    assert len(too_long.content) < 2000  # the message does not echo the string back
    # the probe's 200k stop strings: refused at once rather than slowing every request of the batch
    huge = generate(engine.url, stop=[f"{i:06d}" for i in range(200_000)])
    assert huge.status_code == 400
    at_limit = generate(engine.url, stop=[f"s{i:06d}" for i in range(MAX_STOP_STRINGS)])
    assert at_limit.status_code == 200, at_limit.text


def test_stop_token_id_lists_are_bounded(engine):
    """200k stop token ids were accepted and scanned at every step of the batch; now more than
    MAX_STOP_TOKEN_IDS is a 400 naming the field, on /generate and on both /v1 routes."""
    huge = [5] * 200_000  # ids inside the tiny model's vocabulary: only the bound refuses them
    over = generate(engine.url, stop_token_ids=[5] * (MAX_STOP_TOKEN_IDS + 1))
    assert over.status_code == 400, over.text
    assert over.json()["error"]["param"] == "stop_token_ids" and str(MAX_STOP_TOKEN_IDS) in over.text
    assert generate(engine.url, stop_token_ids=huge).status_code == 400
    for path, body in (("/v1/completions", {"prompt": "12+34="}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        answer = httpx.post(engine.url + path, json={**body, "max_tokens": 2, "stop_token_ids": huge}, timeout=120)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "stop_token_ids" and len(answer.content) < 2000
    at_limit = generate(engine.url, stop_token_ids=[2 + i % 50 for i in range(MAX_STOP_TOKEN_IDS)])  # tiny vocab
    assert at_limit.status_code == 200, at_limit.text


class _BodyOnly:
    """What `read_json` needs of a Starlette request: the body, returned without suspending."""

    def __init__(self, raw: bytes):
        self.raw = raw

    async def body(self) -> bytes:
        return self.raw


def test_a_large_body_is_decoded_and_checked_while_the_loop_runs():
    """The mechanism behind the e2e probes above, without timing: the loop keeps turning while a big body
    is decoded and checked. Decoded on the loop, not one turn happens until it is done."""
    from miles.engines.http import read_json
    from miles.engines.sglang_request import parse_generate

    async def main():
        loop = asyncio.get_running_loop()
        turns = 0
        running = True

        def tick():
            nonlocal turns
            if running:
                turns += 1
                loop.call_soon(tick)

        loop.call_soon(tick)
        call = await read_json(_BodyOnly(BIG_IDS), parse_generate)  # no length bound: every id is checked
        running = False
        return turns, call

    turns, call = asyncio.run(main())
    assert len(call.items[0].input_ids) == 5_000_000
    assert turns >= 10, turns
