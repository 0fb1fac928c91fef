"""Async GRPO end to end on the real engine and Ray: staleness 0 through the producer gives the synchronous
run's journal (same seeds), and a run one version stale stays within its bound, pushes weights under
requests in flight, and reports staleness and the importance-weight metrics."""
import json
from pathlib import Path

import pytest

from miles.backends.group import stop_named_group
from miles.cluster.names import RunNames
from miles.loop import run_loop
from miles.prepare import prepare_config
from miles.run import checkpoint
from miles.trainer import RLTrainer
from tests.support.metrics import is_engine_float

ROLLOUTS = ["--num-rollout", "3", "--save-interval", "1", "--keep-checkpoints", "3"]
ASYNC_ONLY = ("rollout/staleness/", "rollout/mixed_version_ratio", "rollout/buffer_size", "rollout/max_weight_staleness",
              "rollout/reward_by_staleness/", "train/is_weight", "train/ess", "train/mismatch_kl")


def train(config, engine, rollouts=None, names=None):
    trainer = RLTrainer.start(prepare_config(config), engine.url, [engine.url], names)
    run_loop(trainer, rollouts or range(config.rollout.num_rollout))
    run_dir = Path(trainer.config.train.run_dir)
    journal = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    cursors = {}
    for path in sorted((run_dir / "checkpoints").glob("iter_*")):
        cursors[path.name] = json.loads((path / checkpoint.STATE).read_text())["data_cursor"]
    return journal, cursors


def test_staleness_zero_through_the_producer_gives_the_synchronous_journal(small_config, ray_cluster, engine,
                                                                             tmp_path):
    sync, sync_cursors = train(small_config(*ROLLOUTS, "--run-dir", str(tmp_path / "sync")), engine)
    k0, k0_cursors = train(small_config(*ROLLOUTS, "--run-dir", str(tmp_path / "k0"), "--fully-async",
                                        "--max-weight-staleness", "0"), engine)
    assert [r.get("rollout/step") for r in k0] == [r.get("rollout/step") for r in sync]
    for a, s in zip(k0, sync):
        assert set(s) <= set(a)  # async adds its own keys, drops none
        for key, value in s.items():
            if key.startswith(("perf/", "straggler/")) or key in ("time", "timestamp", "_timestamp"):
                continue
            if is_engine_float(key):
                assert a[key] == pytest.approx(value, rel=1e-5, abs=2e-6), key
            else:
                assert a[key] == value, f"rollout {s.get('rollout/step')}: {key}"
        extra = {k for k in set(a) - set(s) if not k.startswith(("perf/", "straggler/"))}
        assert all(k.startswith(ASYNC_ONLY) for k in extra), sorted(extra)
        if "rollout/staleness/max" in a:
            assert a["rollout/staleness/max"] == 0 and a["rollout/mixed_version_ratio"] == 0
    assert sum("rollout/staleness/max" in a for a in k0) == 3
    # checkpoints save the data cursor of the rollout trained, not the producer's (it may have drawn ahead)
    assert k0_cursors == sync_cursors and len(sync_cursors) == 3


def test_one_version_stale_stays_in_its_bound_reports_it_and_resumes(small_config, ray_cluster, engine, tmp_path):
    config = small_config(*ROLLOUTS, "--run-dir", str(tmp_path / "k1"), "--fully-async", "--max-weight-staleness",
                          "1", "--use-tis", "--staleness-guard")
    # Named ranks kept between the two trainers, as a flow's chunks keep them: the ranks start once,
    # and the resume must overwrite all their state
    names = RunNames("async-k1")
    try:
        # the run stops after rollout 1 (a Prefect chunk's end) ...
        _, cursors = train(config, engine, range(0, 2), names)
        # ... having drawn ahead: its checkpoint keeps the cursor of the 2 rollouts it trained
        # (4 prompts each)
        assert cursors["iter_0000001"] == {"epoch": 0, "offset": 8}
        journal, _ = train(config, engine, range(2, 3), names)  # a new trainer attaches: resumes
    finally:
        stop_named_group(names, config.world_size)
    assert [r["rollout_id"] for r in journal if r["rollout_id"] >= 0] == [0, 1, 2]
    rows = [r for r in journal if "rollout/staleness/max" in r]
    assert len(rows) == 3
    for r in rows:
        assert 0 <= r["rollout/staleness/max"] <= 1 and 0 <= r["rollout/mixed_version_ratio"] <= 1
        assert r["rollout/staleness/in_flight_max"] + r["rollout/staleness/in_queue_max"] >= r["rollout/staleness/max"]
        assert r["rollout/buffer_size"] >= 1 and r["perf/wait_time"] >= 0 and 0 <= r["perf/trainer_idle_ratio"] <= 1
        assert 0 < r["train/ess"] <= 1 + 1e-6 and r["train/is_weight_max"] >= r["train/is_weight"] * 0.999
        assert r["train/mismatch_kl"] >= 0 and 0 <= r["train/tis_clipfrac"] <= 1
        assert r["rollout/max_weight_staleness"] in (0.0, 1.0)
        assert r["rollout/staleness_guard/tightened"] in (0.0, 1.0)
