"""Issue 54: `miles diagnose` names the peer a weight push's collective waits for, from the ranks'
records (RUN_DIR/collectives): a rank whose heartbeat stopped, one that never came, one whose
process is gone. Records written by hand as the ranks write them (a dead run: nothing to dump)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from miles.config.health import HealthConfig
from miles.diagnose.bundle import collect
from miles.diagnose.push_waits import push_wait_lines
from miles.record import layout
from miles.run.collective_waits import DONE, TRAIN, WORKING, CollectiveState, write_state

GATHER = "all-gather of the FSDP shards (get_model_state_dict)"


def record(run_dir, rank: int, version: int, beat_age: float = 0.0, pid: int | None = None,
           state: str = "waiting", entered_ago: float = 40.0) -> None:
    s = CollectiveState.entering(rank, f"node0/dp{rank}/pp0/tp0", version, "weight_gather",
                                 GATHER, world_size=2)
    s.entered, s.beat, s.state = time.time() - entered_ago, time.time() - beat_age, state
    if pid is not None:
        s.pid = pid
    write_state(run_dir, s)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_diagnose_names_the_rank_whose_heartbeat_stopped(tmp_path):
    run_dir = tmp_path / "run"
    record(run_dir, 0, 3)
    record(run_dir, 1, 3, beat_age=40.0)  # SIGSTOP'd 40 s ago, its process still there
    (run_dir / layout.JOURNAL).write_text("")  # a run dir: it has a journal (no rollout yet)
    verdict = collect(run_dir, HealthConfig()).verdict
    (line,) = [d for d in verdict["details"] if d.startswith("weight push")]
    assert line.startswith("weight push of version 3: rank 0 (node0/dp0/pp0/tp0) has waited 40 s "
                           f"in weight_gather ({GATHER}) for: rank 1 (node0/dp1/pp0/tp0) "
                           "stopped answering in it"), line
    assert "last heartbeat 40.0 s ago" in line and verdict["ranks"] == [line]


def test_a_rank_that_never_came_and_a_dead_one_are_named(tmp_path):
    record(tmp_path, 0, 5)
    record(tmp_path, 1, 4, state=DONE)  # still in the last push's aftermath
    (line,) = push_wait_lines(tmp_path)
    assert "rank 1 (node0/dp1/pp0/tp0) is not in it (last in weight_gather of version 4: done)" \
        in line
    record(tmp_path, 1, 5, pid=dead_pid())
    (line,) = push_wait_lines(tmp_path)
    assert "rank 1 (node0/dp1/pp0/tp0) died in it (process" in line


def test_ranks_that_are_all_there_and_alive_name_nobody_and_odd_files_are_skipped(tmp_path):
    record(tmp_path, 0, 2)
    record(tmp_path, 1, 2)
    lines = push_wait_lines(tmp_path)
    assert len(lines) == 2  # both wait (for a peer still working): nobody is named
    nobody = "for: no peer is absent or silent (one is still working)"
    assert all(line.endswith(nobody) for line in lines)
    folder = tmp_path / layout.COLLECTIVES
    (folder / "rank-7.json").write_text(json.dumps({"rank": "7"}))  # wrong types: skipped
    (folder / "rank-8.json").write_text("{not json")
    odd = json.loads((folder / "rank-1.json").read_text())
    odd.update(coords="\x1b[2Jnode0", beat=time.time())
    (folder / "rank-1.json").write_text(json.dumps(odd))
    assert all("\x1b" not in line for line in push_wait_lines(tmp_path))
    assert len(push_wait_lines(tmp_path)) == 2  # both ranks wait, none is named


def train_record(run_dir, rank: int, rollout: int, state: str, phase: str, beat_age: float = 0.0):
    what = f"barrier over the ranks after {phase}" if state == "waiting" else ""
    s = CollectiveState.entering(rank, f"node0/dp{rank}/pp0/tp0", rollout, phase, what,
                                 world_size=2, kind="train", state=state)
    s.entered, s.beat = time.time() - 30.0, time.time() - beat_age
    write_state(run_dir, s)


def test_a_hung_training_barrier_names_the_rank_still_in_its_work_or_silent(tmp_path):
    train_record(tmp_path, 0, 2, "waiting", "grad_reduce")
    train_record(tmp_path, 1, 2, "working", "backward")
    (line,) = push_wait_lines(tmp_path)
    assert line.startswith("rollout 2: rank 0 (node0/dp0/pp0/tp0) has waited 30 s in grad_reduce "
                           "(barrier over the ranks after grad_reduce) for: rank 1 "
                           "(node0/dp1/pp0/tp0) is still in its own backward work (30 s so far)")
    train_record(tmp_path, 1, 2, "working", "backward", beat_age=20.0)
    (line,) = push_wait_lines(tmp_path)
    assert "rank 1 (node0/dp1/pp0/tp0) stopped answering in its own backward work" in line


def test_a_rank_long_in_work_that_holds_collectives_names_the_peer_away(tmp_path):
    """FSDP's passes gather inside the rank's own work: a rank stopped while idle leaves the other
    in its own log-probs, blocked; two ranks both long in the same work are no finding."""
    train_record(tmp_path, 0, 6, "working", "log_probs")
    train_record(tmp_path, 1, 6, "working", "log_probs")
    assert push_wait_lines(tmp_path) == []
    train_record(tmp_path, 1, 5, "done", "optimizer")
    (line,) = push_wait_lines(tmp_path)
    assert line.startswith("rollout 6: rank 0 (node0/dp0/pp0/tp0) has been in its own log_probs "
                           "work for 30 s"), line
    assert line.endswith("away: rank 1 (node0/dp1/pp0/tp0) is not in it (last in optimizer of "
                         "rollout 5: done)")


def marked_record(run_dir, rank: int, phase: str, mark: int, collective: str = "") -> None:
    s = CollectiveState.entering(rank, f"node0/dp{rank}/pp0/tp0", 2, phase, collective,
                                 world_size=2, kind=TRAIN, state=WORKING)
    s.entered, s.mark = time.time() - 9.0, mark
    write_state(run_dir, s)


def test_a_training_rank_past_more_collectives_than_a_working_peer_waits_for_it(tmp_path):
    # rank 0 went on into its backward after its forward's mark; rank 1 is still in that forward
    marked_record(tmp_path, 0, "backward", 3, "the ranks' collective after forward")
    marked_record(tmp_path, 1, "forward", 2)
    (line,) = push_wait_lines(tmp_path)
    assert line == ("rollout 2: rank 0 (node0/dp0/pp0/tp0) has waited 9 s in backward (the ranks' "
                    "collective after forward) for: rank 1 (node0/dp1/pp0/tp0) is still in its own "
                    "forward work (9 s so far)")
    marked_record(tmp_path, 1, "backward", 3)  # both past the same collectives: nobody waits
    assert push_wait_lines(tmp_path) == []
