"""End to end: the router in front of two real embedded engines serving the tiny base model."""
from __future__ import annotations

import json

import httpx
import pytest

from miles.config import EngineConfig
from miles.engines.launch import launch_engine
from miles.tiny.warmstart import ensure_base_model

from tests.support.wait import wait_for


@pytest.mark.slow
def test_generate_and_stream_through_the_router_to_embedded_engines(router, tmp_path):
    model = ensure_base_model()
    engines = [launch_engine(model, EngineConfig(engine_device="cpu", engine_max_batch_size=8),
                             log_path=tmp_path / f"engine{i}.log") for i in range(2)]
    try:
        handle = router([e.url for e in engines], router_policy="round-robin", rollout_health_check_interval=0.5)
        request = {"text": "37+58=", "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}
        answers = [httpx.post(handle.url + "/generate", json=request, timeout=120) for _ in range(4)]
        assert all(a.status_code == 200 for a in answers)
        texts = {a.json()["text"] for a in answers}
        assert len(texts) == 1  # greedy: both engines give the same answer
        workers = httpx.get(handle.url + "/workers").json()["workers"]
        assert [w["requests"] for w in workers] == [2, 2]  # round robin across the two engines

        chunks = []
        with httpx.stream("POST", handle.url + "/generate", json={**request, "stream": True}, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:])["text"])
        assert chunks and chunks[-1] == texts.pop()  # SGLang streams the text so far; the last is the whole

        version = httpx.get(engines[0].url + "/get_server_info").json()["weight_version"]
        httpx.post(handle.url + "/update_weight_version", json={"weight_version": version}).raise_for_status()
        wait_for(lambda: all(w["weight_version"] == version
                             for w in httpx.get(handle.url + "/workers").json()["workers"]), 60,
                 "the health loop to read each engine's weight version")
        assert handle.stats()["router_errors"] == 0
    finally:
        for engine in engines:
            engine.stop()
