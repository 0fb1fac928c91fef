"""Probes E11-E13, E17: streams pass through the router as they are made, and a client that leaves
stops the engine's decoding, streamed or not."""
from __future__ import annotations

import json
import socket
import time

import httpx

from tests.support.wait import wait_for

from .probes import AUTH

MAX_NEW = 240  # nearly the tiny model's whole context: the decode takes a good part of a second
LONG = {"text": "12+34=", "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 1.0, "ignore_eos": True}}


def completion_tokens(engine_url: str) -> float:
    """The engine's running total of generated tokens, from its Prometheus metrics."""
    text = httpx.get(engine_url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sglang:generation_tokens_total"))


def test_a_stream_reaches_the_client_through_the_router_as_it_is_made(router):
    url = router().url
    arrivals = []
    with httpx.stream("POST", url + "/generate", json={**LONG, "stream": True}, timeout=120) as response:
        start = time.perf_counter()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter() - start)
    assert len(arrivals) > 100
    # passed through: the chunks arrived spread over the decode, not all at its end
    assert arrivals[0] < arrivals[-1] / 2


def test_intermediate_chunks_carry_the_batch_weight_version(engine, router):
    url = router().url
    versions = set()
    with httpx.stream("POST", url + "/generate", json={**LONG, "stream": True}, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                versions.add(json.loads(line[6:])["meta_info"]["weight_version"])
    assert versions == {httpx.get(engine.url + "/get_weight_version").json()["weight_version"]}


def running(engine_url: str) -> int:
    return httpx.get(engine_url + "/get_server_info", timeout=30).json()["num_running_reqs"]


def _leave_once_decoding(engine_url: str, url: str, body: dict, stream: bool) -> None:
    """Send a /generate over a raw socket and close it as soon as the engine has started decoding."""
    payload = json.dumps({**body, "stream": stream}).encode()
    host_port = url.removeprefix("http://")
    with socket.create_connection(tuple(host_port.rsplit(":", 1)[0:1]) + (int(host_port.rsplit(":", 1)[1]),)) as s:
        # a loopback Host, as real clients send (the servers refuse other names: DNS rebinding)
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (host_port.encode(), len(payload), payload))
        if stream:
            s.recv(1)
        else:  # no byte comes back before the end: ask the engine
            wait_for(lambda: running(engine_url) > 0, 30, "the engine to start decoding")


def _decoded_after_leaving(engine, url: str, stream: bool) -> float:
    def idle() -> bool:
        return running(engine.url) == 0
    wait_for(idle, 60, "an idle engine")
    before = completion_tokens(engine.url)
    _leave_once_decoding(engine.url, url, LONG, stream)
    wait_for(idle, 60, "the engine to drop the abandoned request")
    return completion_tokens(engine.url) - before


def test_a_client_leaving_a_stream_through_the_router_stops_decoding(engine, router):
    assert _decoded_after_leaving(engine, router().url, stream=True) < MAX_NEW - 40


def test_a_client_leaving_a_plain_request_stops_decoding(engine, router):
    url = router().url
    assert _decoded_after_leaving(engine, engine.url, stream=False) < MAX_NEW - 40
    assert _decoded_after_leaving(engine, url, stream=False) < MAX_NEW - 40
    httpx.post(engine.url + "/continue_generation", headers=AUTH)
