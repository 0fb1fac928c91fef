"""The embedded engine's native SGLang API against a live engine on loopback."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.support.engines import MAX_BATCH, MAX_QUEUED, post_while_paused, queued
from tests.support.wait import wait_for

GREEDY = {"temperature": 0, "max_new_tokens": 8}


def generate(client, **body):
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_generate_shape_and_logprobs(client):
    out = generate(client, text="37+58=", sampling_params=GREEDY, return_logprob=True)
    meta = out["meta_info"]
    assert set(out) >= {"text", "output_ids", "meta_info"}
    assert meta["prompt_tokens"] == 6  # one token per character
    assert meta["completion_tokens"] == len(out["output_ids"]) > 0
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["weight_version"] == "default"
    assert isinstance(meta["id"], str) and meta["id"]
    logprobs = meta["output_token_logprobs"]
    assert [t for _, t, _ in logprobs] == out["output_ids"]
    assert all(lp <= 0 and text is None for lp, _, text in logprobs)


def test_eos_finish_matches_token_and_is_trimmed(client):
    out = generate(client, text="37+58=", sampling_params=GREEDY)
    meta = out["meta_info"]
    if meta["finish_reason"]["type"] == "stop":  # the base model answers then emits <|im_end|> (id 2)
        assert meta["finish_reason"]["matched"] == 2 and out["output_ids"][-1] == 2
        assert "<|im_end|>" not in out["text"]


def test_input_ids_and_batched_text(client):
    ids = client.post("/generate", json={"input_ids": [6, 10, 75, 8, 11, 83], "sampling_params": GREEDY}).json()
    text = generate(client, text="37+58=", sampling_params=GREEDY)
    assert ids["output_ids"] == text["output_ids"]  # "37+58=" is those ids
    batch = generate(client, text=["1+1=", "22+33=", "9+9="], sampling_params=GREEDY)
    assert isinstance(batch, list) and len(batch) == 3
    assert len({b["meta_info"]["id"] for b in batch}) == 3
    per_item = generate(client, input_ids=[[4, 75, 4, 83], [4, 75, 4, 83]],
                        sampling_params=[{"max_new_tokens": 1, "temperature": 0},
                                         {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}])
    assert [p["meta_info"]["completion_tokens"] for p in per_item] == [1, 2]


def test_length_and_stop_conditions(client):
    long = generate(client, text="1+2=", sampling_params={"max_new_tokens": 5, "ignore_eos": True, "temperature": 0})
    assert long["meta_info"]["finish_reason"]["type"] == "length"
    assert long["meta_info"]["completion_tokens"] == 5
    base = generate(client, text="37+58=", sampling_params=GREEDY)
    first = base["output_ids"][0]
    by_token = generate(client, text="37+58=", sampling_params={**GREEDY, "stop_token_ids": [first]})
    assert by_token["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}
    assert by_token["output_ids"] == [first] and by_token["text"] == ""
    stop_str = base["text"][-1]
    by_text = generate(client, text="37+58=", sampling_params={**GREEDY, "stop": [stop_str]})
    assert by_text["meta_info"]["finish_reason"]["matched"] == stop_str
    assert by_text["text"] == base["text"][: base["text"].index(stop_str)]
    kept = generate(client, text="37+58=", sampling_params={**GREEDY, "stop": stop_str, "no_stop_trim": True})
    assert kept["text"].endswith(stop_str)
    zero = generate(client, text="1+2=", sampling_params={"max_new_tokens": 0})
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"]["type"] == "length"


def test_health_info_and_cache_endpoints(client, base_model):
    assert client.get("/health").status_code == 200
    health = client.get("/health_generate")
    assert health.status_code == 200 and health.json()["healthy"] is True
    info = client.get("/get_model_info").json()
    assert info["model_path"] == str(base_model) and info["is_generation"] is True
    assert info["weight_version"] == "default"
    server = client.get("/get_server_info").json()
    assert server["max_batch_size"] == MAX_BATCH and server["max_queued_requests"] == MAX_QUEUED
    assert server["context_length"] == 256 and server["weight_version"] == "default"
    assert server["device"] == "cpu" and server["dtype"] == "float32"
    assert client.post("/flush_cache").json()["success"] is True


def test_metrics_use_sglang_names_and_count(client):
    def scrape() -> dict[str, float]:
        values = {}
        for line in client.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name.split("{")[0]] = values.get(name.split("{")[0], 0.0) + float(value)
        return values

    before = scrape()
    out = generate(client, text="12+34=", sampling_params={"max_new_tokens": 4, "ignore_eos": True})
    after = scrape()
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:e2e_request_latency_seconds_count",
                 "sglang:time_to_first_token_seconds_count", "sglang:gen_throughput"):
        assert name in after
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == 4
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == 6
    assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == 1
    assert out["meta_info"]["completion_tokens"] == 4


def test_concurrent_requests_are_decoded_together(engine, client):
    before = client.get("/get_server_info").json()
    # ignore_eos: all rows end at the same step, so the second 16 wait for the first to leave together
    # (a row ending early at EOS would let a waiting request into its place at once)
    bodies = [{"text": f"{i}+{i}=", "sampling_params": {"max_new_tokens": 3, "temperature": 1.0, "ignore_eos": True}}
              for i in range(2 * MAX_BATCH)]
    responses = post_while_paused(engine.url, "/generate", bodies)
    assert all(r.status_code == 200 for r in responses)
    after = client.get("/get_server_info").json()
    assert after["max_batch_size_seen"] == MAX_BATCH  # 32 queued requests -> two full prefill groups
    assert after["num_batches"] - before["num_batches"] == 2
    assert after["num_decode_steps"] - before["num_decode_steps"] == 4  # 2 per group: 3 tokens, 1 from prefill


def test_queue_full_is_503_and_engine_recovers(engine, client):
    from concurrent.futures import ThreadPoolExecutor

    body = {"text": "1+1=", "sampling_params": {"max_new_tokens": 1}}
    client.post("/pause_generation")
    try:
        with ThreadPoolExecutor(MAX_QUEUED) as pool:
            futures = [pool.submit(httpx.post, engine.url + "/generate", json=body, timeout=120) for _ in
                       range(MAX_QUEUED)]
            wait_for(lambda: queued(client) == MAX_QUEUED, 60, "a full queue", interval=0.02)
            full = client.post("/generate", json=body)
            client.post("/continue_generation")
            assert all(f.result().status_code == 200 for f in futures)
    finally:
        client.post("/continue_generation")
    assert full.status_code == 503
    assert "queue is full" in full.json()["error"]["message"]
    assert client.post("/generate", json=body).status_code == 200


def test_abort_queued_request_by_rid_and_all(engine, client):
    from concurrent.futures import ThreadPoolExecutor

    def body(rid):
        return {"text": "1+1=", "rid": rid, "sampling_params": {"max_new_tokens": 2}}

    client.post("/pause_generation")
    try:
        with ThreadPoolExecutor(3) as pool:
            futures = {rid: pool.submit(httpx.post, engine.url + "/generate", json=body(rid), timeout=120)
                       for rid in ("a1", "a2", "a3")}
            wait_for(lambda: queued(client) == 3, 60, "three queued requests", interval=0.02)
            assert client.post("/abort_request", json={"rid": "a1"}).json()["aborted"] == 1
            assert client.post("/abort_request", json={"rid": "nope"}).json()["aborted"] == 0
            assert client.post("/abort_request", json={"abort_all": True}).json()["aborted"] == 2
            results = {rid: f.result().json() for rid, f in futures.items()}
    finally:
        client.post("/continue_generation")
    for rid, out in results.items():
        assert out["meta_info"]["id"] == rid
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert client.post("/abort_request", json={}).status_code == 400


def test_abort_running_streamed_request(engine, client):
    budget = 240  # far more tokens than can be decoded before the abort below arrives
    body = {"text": "1+1=", "rid": "long-one", "stream": True,
            "sampling_params": {"max_new_tokens": budget, "ignore_eos": True}}
    chunks = []
    with client.stream("POST", "/generate", json=body) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            chunks.append(json.loads(line[len("data: "):]))
            if len(chunks) == 1:
                assert client.post("/abort_request", json={"rid": "long-one"}).json()["aborted"] == 1
    final = chunks[-1]["meta_info"]
    assert final["finish_reason"]["type"] == "abort"
    assert final["completion_tokens"] < budget
    assert chunks[0]["meta_info"]["finish_reason"] is None


BAD_REQUESTS = [
    (b"{not json", "not valid JSON"),
    (json.dumps({"sampling_params": {"max_new_tokens": 4}}), "exactly one of `text` or `input_ids`"),
    (json.dumps({"text": "1+1=", "sampling_params": {"max_new_tokens": -1}}), "max_new_tokens must be >= 0"),
    (json.dumps({"text": "1+1=", "sampling_params": {"max_new_tokens": 10**6}}), "maximum context length"),
    (json.dumps({"text": "1" * 300}), "longer than the model's context length"),
    (json.dumps({"text": "1+1=", "sampling_params": {"temperature": "hot"}}), "temperature must be a number"),
    (json.dumps({"text": "1+1=", "sampling_params": {"top_p": 2}}), "top_p must be in (0, 1]"),
    (json.dumps({"text": "1+1=", "sampling_params": {"top_k": 2.5}}), "top_k must be an integer"),
    (json.dumps({"text": "1+1=", "sampling_params": {"stop": 5}}), "stop must be"),
    (json.dumps({"text": "1+1=", "sampling_params": {"ignore_eos": "yes"}}), "ignore_eos must be true or false"),
    (json.dumps({"text": "1+1=", "sampling_params": {"frequency_penalty": 0.5}}), "not supported"),
    (json.dumps({"text": "1+1=", "sampling_params": "hot"}), "sampling_params must be an object"),
    (json.dumps({"input_ids": [1, 2, 10**7]}), "outside the vocabulary"),
    (json.dumps({"text": ""}), "the prompt is empty"),
    (json.dumps([1, 2]), "must be a JSON object"),
]


@pytest.mark.parametrize("raw,message", BAD_REQUESTS, ids=[m for _, m in BAD_REQUESTS])
def test_bad_requests_are_400_with_the_reason(client, raw, message):
    response = client.post("/generate", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    assert client.post("/generate", json={"text": "1+1=", "sampling_params": {"max_new_tokens": 1}}).status_code == 200


def test_unknown_fields_are_ignored(client):
    out = client.post("/generate", json={"text": "1+1=", "no_such_field": 1,
                                          "sampling_params": {"max_new_tokens": 1, "made_up": True}})
    assert out.status_code == 200


def test_a_client_that_leaves_has_its_request_aborted(engine, client):
    """A non-streamed /generate whose client disconnects is aborted (the watch on the client starts only
    once the request has waited a while): paused, so the request is surely still queued when it leaves."""
    import socket

    body = json.dumps({"text": "1+1=", "rid": "leaver", "sampling_params": {"max_new_tokens": 4}}).encode()
    head = (f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:{engine.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    client.post("/pause_generation").raise_for_status()
    try:
        with socket.create_connection(("127.0.0.1", engine.port), timeout=60) as sock:
            sock.sendall(head + body)
            wait_for(lambda: queued(client) == 1, 60, "the request in the queue", interval=0.02)
        wait_for(lambda: queued(client) == 0, 60, "the queue emptied by the abort", interval=0.02)
    finally:
        client.post("/continue_generation").raise_for_status()
    # nothing of it was decoded: the abort took it out of the queue
    assert client.post("/abort_request", json={"rid": "leaver"}).json()["aborted"] == 0
