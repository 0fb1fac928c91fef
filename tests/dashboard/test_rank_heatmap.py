"""Issue 54: `/api/ranks`, the rank x phase heat map: each rank's own work per phase summed over the
run from the timeline's rank lanes (`kind` compute spans with coordinates), waits left out, the
hottest cell naming the slow rank and phase. A hand-made timeline; the recorded run (coarse rank
spans, no coordinates) has none."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from miles.dashboard.app import build_app
from miles.record.timeline import Span
from tests.support.rank_timelines import COORDS, OWN, rank_spans


def ranks_of(run_dir) -> dict:
    response = TestClient(build_app(run_dir)).get("/api/ranks")
    assert response.status_code == 200, response.text
    return response.json()


def test_the_heat_map_sums_own_work_per_rank_and_phase_and_names_the_slow_cell(run_copy):
    with (run_copy / "timeline.jsonl").open("a") as f:  # beside the recorded run's own spans
        f.write("".join(s.to_json() + "\n" for s in rank_spans()))
    data = ranks_of(run_copy)
    assert data["available"] and data["rollouts"] == 2
    assert data["ranks"] == [{"lane": lane, "coords": c, "traces": []}
                             for lane, c in COORDS.items()]  # no profiler window ran
    # a step's order; waits are no phase
    assert data["phases"] == ["forward", "backward", "optimizer"]
    for i in range(3):
        for j, phase in enumerate(data["phases"]):
            # differences of epoch seconds: about 1e-7 s of float precision
            assert data["seconds"][i][j] == pytest.approx(2 * OWN[phase][i], abs=1e-5)
    assert data["ratio"][1][1] == pytest.approx(3.0, rel=1e-4)
    assert data["ratio"][0][1] == pytest.approx(1.0, rel=1e-4)
    hottest = data["hottest"]
    named = (hottest["lane"], hottest["coords"], hottest["phase"])
    assert named == ("rank1", COORDS["rank1"], "backward")
    assert hottest["seconds"] == pytest.approx(3.0, rel=1e-4)
    assert hottest["median"] == pytest.approx(1.0, rel=1e-4)


def test_a_run_without_rank_phase_spans_has_no_heat_map(run_copy):
    data = ranks_of(run_copy)  # the recorded run: coarse log_probs/actor_train spans only
    assert data == {"available": False, "ranks": [], "phases": [], "seconds": [], "ratio": [],
                    "rollouts": 0, "hottest": None}
    odd = {"lane": "rank0", "name": "forward", "start": 1.0, "end": 2.0, "rollout_id": 0,
           "args": {"kind": "compute", "coords": ["not", "text"]}}
    (run_copy / "timeline.jsonl").write_text(json.dumps(odd) + "\n")
    assert ranks_of(run_copy)["available"] is False


def test_an_engine_lane_does_not_count_in_the_ranks_medians(run_copy):
    """Two ranks and an engine lane (its push spans carry coordinates too): a training phase's
    median is the two ranks', not a third 0 s from the engine, and the engine's own phases are
    judged among engines."""
    two = [s for s in rank_spans() if s.lane != "rank2"]
    engine = {"kind": "compute", "coords": "engine0 http://127.0.0.1:30000"}
    pushes = [Span("engine0", phase, 1796104101.0 + k, 1796104101.1 + k, 0, engine)
              for k, phase in enumerate(("receive", "apply"))]
    with (run_copy / "timeline.jsonl").open("a") as f:
        f.write("".join(s.to_json() + "\n" for s in two + pushes))
    data = ranks_of(run_copy)
    assert [r["lane"] for r in data["ranks"]] == ["rank0", "rank1", "engine0"]
    backward = data["phases"].index("backward")
    assert data["ratio"][1][backward] == pytest.approx(1.5, rel=1e-4)  # 3 s vs the ranks' 2 s
    assert data["hottest"]["median"] == pytest.approx(2.0, rel=1e-4)
    assert data["ratio"][2][data["phases"].index("apply")] == pytest.approx(1.0)


def test_a_rank_lists_its_profiler_windows_and_serves_only_their_traces(run_copy, tmp_path):
    with (run_copy / "timeline.jsonl").open("a") as f:
        f.write("".join(s.to_json() + "\n" for s in rank_spans()))
    (run_copy / "profiler").mkdir()
    (run_copy / "profiler" / "rank1.json.gz").write_bytes(b"rank 1's trace")
    (tmp_path / "secret").write_text("outside the run")
    windows = [{"target": "train_actor", "rank": 1, "start": 3, "end": 4,
                "trace": "profiler/rank1.json.gz"},
               {"target": "train_actor", "rank": 0, "start": 3, "end": 4,
                "trace": str(tmp_path / "secret")},  # a hand-edited summary
               {"target": "train_actor", "rank": 0, "start": 5, "end": 6,
                "trace": "../" * 8 + str(tmp_path / "secret")}]
    (run_copy / "profiler" / "summaries.jsonl").write_text(
        "".join(json.dumps(w) + "\n" for w in windows))
    client = TestClient(build_app(run_copy))
    ranks = {r["lane"]: r["traces"] for r in client.get("/api/ranks").json()["ranks"]}
    assert ranks["rank1"] == [{"index": 0, "target": "train_actor", "start": 3, "end": 4}]
    assert [w["index"] for w in ranks["rank0"]] == [1, 2] and ranks["rank2"] == []
    assert client.get("/api/profiler/0/trace").content == b"rank 1's trace"
    for index in (1, 2, 3, -1):  # outside the run dir, or no such window
        assert client.get(f"/api/profiler/{index}/trace").status_code == 404


def test_a_phase_of_microseconds_is_even_however_its_ratio_reads(run_copy):
    """FSDP's grad_reduce takes microseconds: one rank's 0.2 ms against the other's 0.1 ms is 2x and
    means nothing; within 10 ms of the median over the run a cell is even and never the hottest."""
    spans = [s for s in rank_spans() if s.lane != "rank2"]
    tiny = {"rank0": 0.0002, "rank1": 0.0001}
    spans += [Span(lane, "grad_reduce", 1796104102.0, 1796104102.0 + seconds, 0,
                   {"kind": "compute", "coords": COORDS[lane]}) for lane, seconds in tiny.items()]
    with (run_copy / "timeline.jsonl").open("a") as f:
        f.write("".join(s.to_json() + "\n" for s in spans))
    data = ranks_of(run_copy)
    column = data["phases"].index("grad_reduce")
    assert [row[column] for row in data["ratio"]] == [1.0, 1.0]
    assert data["hottest"]["phase"] == "backward"
