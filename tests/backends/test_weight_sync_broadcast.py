"""`--update-weight-transfer-mode broadcast` end to end: a real FSDP or Megatron rank (Ray actor)
streams its HF export to a live engine in buckets; after every push the engine's weight digest
equals the rank's, and the push's bucket metrics come back through WeightSync."""
from __future__ import annotations

import httpx
import pytest

from miles.backends.group import ActorGroup
from miles.backends.sync import WeightSync, WeightSyncError
from miles.config import EngineConfig
from miles.engines.launch import launch_engine
from tests.support.actors import config, rollout_like, step

BUCKET_BYTES = 300_000  # the tiny model (1.6 MB) in several buckets


@pytest.fixture(scope="module")
def engine(base_model, tmp_path_factory):
    handle = launch_engine(base_model, EngineConfig(engine_device="cpu", engine_max_batch_size=4),
                           log_path=tmp_path_factory.mktemp("sync-engine") / "engine.log")
    yield handle
    handle.stop()


@pytest.fixture(scope="module", params=["fsdp", "megatron"])
def group(request, ray_cluster, base_model):
    cfg = config(1, train_backend=request.param, update_weight_transfer_mode="broadcast",
                 update_weight_buffer_size=BUCKET_BYTES)
    made = ActorGroup(cfg, str(base_model))
    yield made
    made.stop()


def engine_state(url: str) -> tuple[str, str]:
    body = httpx.get(url + "/weights_digest", timeout=60).json()
    return body["digest"], body["weight_version"]


def test_every_push_leaves_the_engine_digest_equal_to_the_ranks_export(group, engine, tmp_path):
    sync = WeightSync(group, [engine.url], None, tmp_path, in_memory=False)
    assert sync.transfer_mode == "broadcast" and sync.buffer_bytes == BUCKET_BYTES
    sync.push(1)
    assert engine_state(engine.url) == (group.call("weights_digest")[0], "1")
    m = sync.last_times
    assert m["perf/update_weights_buckets"] >= 3
    assert m["perf/update_weights_bucket_bytes/max"] <= BUCKET_BYTES
    assert m["perf/update_weights_bytes"] > 0 and m["perf/update_weights_gb_per_s"] > 0
    assert {"perf/update_weights_rank_0_time", "perf/update_weights_engine_0_time"} <= m.keys()
    assert not list(tmp_path.iterdir())  # nothing went through the disk
    samples, advantages = rollout_like()
    step(group, group.config, samples, advantages)
    trained = group.call("weights_digest")[0]
    sync.push(2, pause_mode="in_place")  # async training's push: paused around the transfer
    assert engine_state(engine.url) == (trained, "2")
    assert m["perf/update_weights_connect_time"] > 0  # the first push built the group
    assert sync.last_times["perf/update_weights_connect_time"] == 0  # the second kept it
    probe = {"text": "1+1=", "sampling_params": {"max_new_tokens": 2}}
    answer = httpx.post(engine.url + "/generate", json=probe, timeout=60).json()
    assert answer["meta_info"]["weight_version"] == "2"  # generation continued


def test_a_failed_broadcast_is_a_weight_sync_error_and_keeps_the_weights(group, engine, tmp_path):
    before = engine_state(engine.url)
    sync = WeightSync(group, [engine.url, "http://127.0.0.1:9"], None, tmp_path, in_memory=False)
    with pytest.raises(WeightSyncError, match="127.0.0.1:9"):
        sync.push(5)
    assert engine_state(engine.url) == before
