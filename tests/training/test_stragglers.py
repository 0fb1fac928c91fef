"""Straggler metrics from each rank's own phase seconds, the slow-rank fault's spec, the recorder's
spans and the rank lanes the trainer writes from them (no process group: one process)."""
import json
from types import SimpleNamespace

import pytest

from miles.backends.rank_phases import (ARRIVE, COMPUTE, WAIT, RankPhaseRecorder, RankSpans,
                                       settle_waits)
from miles.config import ConfigError
from miles.record.timeline import TimelineWriter
from miles.run.faults import FaultInjector, SlowRank, check_faults, parse_faults, slow_rank
from miles.run.stragglers import RankCoords, slowest, straggler_metrics, straggling
from miles.run.rank_lanes import rank_straggler_metrics, write_rank_lanes


def test_the_slowest_rank_is_named_by_its_coordinates():
    ranks = [(RankCoords(0, 0), {"forward": 1.0, "backward": 2.0}),
             (RankCoords(0, 1), {"forward": 1.2, "backward": 2.0}),
             (RankCoords(1, 2), {"forward": 3.0, "backward": 2.2})]
    m = straggler_metrics(ranks)
    stats = [m[f"straggler/forward/{key}"] for key in ("min", "median", "max")]
    assert stats == [1.0, 1.2, 3.0]
    assert m["straggler/forward/slowdown"] == pytest.approx(2.5)
    assert slowest(m, "forward") == RankCoords(node=1, dp=2)
    assert slowest(m, "backward") == RankCoords(node=1, dp=2)
    assert m["straggler/backward/slowdown"] == pytest.approx(1.1)
    assert slowest(m, "optimizer") is None and not any("optimizer" in key for key in m)
    assert all(isinstance(value, float) for value in m.values())  # what every tracker holds
    # forward: 2.5x and 1.8 s over the median; backward: 1.1x
    assert straggling(m) == {"forward": RankCoords(node=1, dp=2)}
    both = {"forward": RankCoords(1, 2), "backward": RankCoords(1, 2)}
    assert straggling(m, slowdown=1.05, lag=0.1) == both
    assert straggling(m, lag=2.0) == {}  # a ratio alone (ms-scale jitter) is not a straggler


def test_even_ranks_and_a_phase_one_rank_skipped():
    m = straggler_metrics([(RankCoords(0, 0), {"grad_reduce": 0.0}),
                           (RankCoords(0, 1), {"grad_reduce": 0.0})])
    assert m["straggler/grad_reduce/slowdown"] == 1.0  # nothing took time: no one is slow
    m = straggler_metrics([(RankCoords(0, 0), {"log_probs": 2.0}),
                           (RankCoords(0, 1, pp=1, tp=1), {})])
    assert m["straggler/log_probs/min"] == 0.0 and slowest(m, "log_probs") == RankCoords(0, 0)
    assert straggler_metrics([]) == {}


def test_the_slow_rank_fault_is_parsed_and_left_to_the_rank(tmp_path):
    assert slow_rank("raise@1,slow-rank:1:backward:0.5@2", 1) == SlowRank("backward", 0.5, 2)
    assert slow_rank("slow-rank:1:forward@0", 1) == SlowRank("forward", 1.0, 0)
    assert slow_rank("slow-rank:1:forward@0", 0) is None and slow_rank(None, 0) is None
    for bad in ("slow-rank:1:decode@1", "slow-rank@1", "slow-rank:1@1", "slow-rank:a:forward@1"):
        with pytest.raises(ConfigError, match="slow-rank:RANK:PHASE"):
            parse_faults(bad)
    check_faults("slow-rank:1:backward@2", world_size=2)
    with pytest.raises(ConfigError, match="no training rank 2"):  # refused before the run starts
        check_faults("slow-rank:2:backward@2", world_size=2)
    (fault,) = parse_faults("slow-rank:1:backward:0.5@2")
    assert fault.name == "slow-rank:1:backward:0.5@2"
    # the driver's injector does not fire it (the rank does)
    FaultInjector("slow-rank:1:backward@0", tmp_path).before_iteration(0)
    assert not (tmp_path / "faults").exists()


def test_spans_waits_and_the_slow_phase_on_one_rank():
    rec = RankPhaseRecorder(RankCoords(0, 1), slow=SlowRank("backward", 0.05, 3))
    for rollout_id in (2, 3):
        rec.begin(rollout_id)
        for _ in range(2):
            with rec.span("forward"):
                pass
            with rec.span("backward"):
                pass
        rec.arrive("grad_reduce")  # a mark only: no process group needed, nothing waited
        rec.arrive("forward", between_passes=True)  # this backend's passes hold no collectives
        spans = rec.take()
        kinds = [(p, k) for p, k, _, _ in spans.spans]
        assert kinds == [("forward", COMPUTE), ("backward", COMPUTE)] * 2 + [("grad_reduce", ARRIVE)]
        assert rec.arrivals == 1
        settle_waits([spans])  # one rank: nobody to wait for, the mark goes
        assert [(p, k) for p, k, _, _ in spans.spans] == kinds[:-1]
        slept = spans.seconds()["backward"] >= 0.05  # once, in rollout 3 only
        assert slept == (rollout_id == 3)
    with pytest.raises(ValueError, match="unknown rank phase"):
        with rec.span("decode"):
            pass
    off = RankPhaseRecorder(RankCoords(0, 0), enabled=False)
    with off.span("forward"):
        pass
    assert off.take() is None


def test_the_rank_lanes_hold_compute_and_wait_spans_with_coordinates(tmp_path):
    coords = RankCoords(0, 1)
    recorded = RankSpans(coords, [("forward", COMPUTE, 10.0, 11.0), ("forward", WAIT, 11.0, 11.5)])
    results = [SimpleNamespace(rank_spans=None), SimpleNamespace(rank_spans=recorded)]
    summary = SimpleNamespace(phases={0: [("log_probs", 1.0, 2.0), ("actor_train", 2.0, 3.0)],
                                      1: [("log_probs", 1.0, 2.0), ("actor_train", 2.0, 3.0),
                                          ("token_stats", 3.0, 3.1)]})
    timeline = TimelineWriter(tmp_path / "timeline.jsonl")
    write_rank_lanes(timeline, 4, summary, results)
    timeline.close()
    spans = [json.loads(line) for line in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    got = [(s["lane"], s["name"], s.get("args", {})) for s in spans]
    # rank 0 recorded nothing (a fake): its coarse spans
    assert got == [("rank0", "log_probs", {}), ("rank0", "actor_train", {}),
                   ("rank1", "token_stats", {}),
                   ("rank1", "forward", {"kind": "compute", "coords": "node0/dp1/pp0/tp0"}),
                   ("rank1", "wait", {"kind": "wait", "coords": "node0/dp1/pp0/tp0",
                                      "phase": "forward"})]
    assert rank_straggler_metrics(results)["straggler/forward/max"] == 1.0  # the wait left out


def test_a_rank_waiting_is_not_busy_on_the_dashboard():
    from miles.dashboard.views import utilization

    spans = [{"lane": "rank0", "name": "forward", "start": 0.0, "end": 1.0, "rollout_id": 0,
              "args": {"kind": COMPUTE}},
             {"lane": "rank0", "name": "wait", "start": 1.0, "end": 2.0, "rollout_id": 0,
              "args": {"kind": WAIT, "phase": "forward"}}]
    assert utilization(spans, ["rank0"]) == {"rank0": 0.5}
