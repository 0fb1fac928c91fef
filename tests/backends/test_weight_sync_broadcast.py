"""`--update-weight-transfer-mode broadcast` end to end: a real FSDP rank (Ray actor), or two
Megatron ranks at PP=2 (each stage's source rank sending its own layers over its own group, at
once), stream their HF export to a live engine in buckets; after every push the engine's weight
digest equals the ranks' whole export, and the push's bucket and per-stage metrics come back
through WeightSync. Under --use-fault-tolerance a failed broadcast marks the engines for the
supervisor, which brings them up to date from the directory the push also wrote."""
from __future__ import annotations

import httpx
import pytest

from miles.backends.group import ActorGroup
from miles.backends.megatron import convert
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


@pytest.fixture(scope="module", params=["fsdp", "megatron-pp2"])
def group(request, ray_cluster, base_model):
    layout = {"fsdp": (1, {}), "megatron-pp2": (2, {"train_backend": "megatron",
                                                     "pipeline_model_parallel_size": 2})}
    world, extra = layout[request.param]
    cfg = config(world, update_weight_transfer_mode="broadcast",
                 update_weight_buffer_size=BUCKET_BYTES, **extra)
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
    each_stage_sent_its_own_layers(group, m)
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


def each_stage_sent_its_own_layers(group, m: dict) -> None:
    """Stage s's group carried exactly its layers (the embedding with the first, the final norm
    with the last; a tied head with neither): the stages' bytes add up to the whole export."""
    export = group.call("export_weights", None)[0]  # rank 0: the whole HF state, no tied head
    stages = group.config.train.pipeline_model_parallel_size
    num_layers = 1 + max(int(k.split(".")[2]) for k in export if k.startswith("model.layers."))
    for stage in range(stages):
        layers = convert.stage_layers(num_layers, stages, stage)
        mine = [t for k, t in export.items() if
                (k.startswith("model.layers.") and int(k.split(".")[2]) in layers)
                or (k == "model.embed_tokens.weight" and stage == 0)
                or (k in ("model.norm.weight", "lm_head.weight") and stage == stages - 1)]
        assert m[f"perf/update_weights_pp_{stage}_bytes"] == sum(t.nbytes for t in mine)
    total = sum(t.nbytes for t in export.values())
    assert sum(m[f"perf/update_weights_pp_{s}_bytes"] for s in range(stages)) == total
    assert m["perf/update_weights_bytes"] == total
    assert all(m[f"perf/update_weights_pp_{s}_time"] > 0 for s in range(stages))
    print("per stage:", {k: round(v, 4) for k, v in m.items() if "_pp_" in k or "rank_" in k
                         or k in ("perf/update_weights_bytes", "perf/update_weights_gb_per_s")})


class Supervisor:
    """What WeightSync asks of the engine supervisor: the ready engines, and the ones it marks."""

    def __init__(self, ready: list[str]):
        self.ready, self.failed = ready, {}

    def ready_urls(self) -> list[str]:
        return list(self.ready)

    def engine_failed(self, url: str, reason: str) -> None:
        self.failed[url] = reason

    def attach_weights(self, weights) -> None:
        pass


def test_a_failed_broadcast_is_a_weight_sync_error_and_keeps_the_weights(group, engine, tmp_path):
    before = engine_state(engine.url)
    dead = "http://127.0.0.1:9"
    sync = WeightSync(group, [engine.url, dead], None, tmp_path, in_memory=False)
    with pytest.raises(WeightSyncError, match="127.0.0.1:9"):
        sync.push(5)
    assert engine_state(engine.url) == before
    # supervised: the push names each engine that missed it for the supervisor, which loads
    # them from the directory the ranks wrote too; the next push rebuilds the groups
    supervisor = Supervisor([engine.url, dead])
    sync = WeightSync(group, [engine.url, dead], None, tmp_path, in_memory=False,
                      supervisor=supervisor)
    sync.push(6)
    assert set(supervisor.failed) == {engine.url, dead} and dead in supervisor.failed[dead]
    assert sync.current() == (tmp_path / "v000006", 6) and (tmp_path / "v000006").is_dir()
    assert engine_state(engine.url) == before
    supervisor.ready, supervisor.failed = [engine.url], {}
    sync.push(7)
    assert not supervisor.failed
    assert engine_state(engine.url) == (group.call("weights_digest")[0], "7")
