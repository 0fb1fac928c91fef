"""Issue 54: whom a hung training collective waits for. Two FSDP ranks; `--inject-fault
slow-rank:1:forward:6@0` keeps rank 1 in its own forward for 6 s while rank 0, past its forward,
waits in its backward's first collective (FSDP gathers the parameters). While they are in it,
`miles diagnose`'s lines (from the ranks' records in RUN_DIR/collectives: rank 0 has gone into one
collective more than rank 1) name rank 1 as still in its own forward work; afterwards every
record is done. The announcing thread's rules are checked on a recorder alone."""
from __future__ import annotations

import time

import ray

from miles.backends.group import ActorGroup
from miles.backends.pack import split_for_ranks
from miles.backends.rank_activity import ANNOUNCE_S, RankActivity
from miles.backends.rank_phases import COMPUTE, RankPhaseRecorder
from miles.diagnose.push_waits import push_wait_lines
from miles.run.collective_waits import DONE, TRAIN, WORKING, read_states
from miles.run.stragglers import RankCoords
from tests.support.actors import config, rollout_like

SLEEP = 6.0


def test_a_rank_slow_in_its_own_work_is_named_while_the_other_waits(ray_cluster, base_model,
                                                                     tmp_path):
    cfg = config(2, inject_fault=f"slow-rank:1:forward:{SLEEP}@0", run_dir=tmp_path)
    group = ActorGroup(cfg, str(base_model))
    try:
        batches = split_for_ranks(*rollout_like(), cfg.global_batch_size, cfg.world_size,
                                  rollout_id=0)
        refs = [a.train.remote(b) for a, b in zip(group.actors, batches)]
        seen: list[str] = []
        while not seen and ray.wait(refs, num_returns=2, timeout=0.2)[1]:
            seen = [line for line in push_wait_lines(tmp_path)
                    if "rank 1 (node0/dp1/pp0/tp0) is still in its own forward work" in line]
        ray.get(refs)
    finally:
        group.stop()
    (line,) = seen
    assert line.startswith("rollout 0: rank 0 (node0/dp0/pp0/tp0) has waited"), line
    assert "in backward (the ranks' collective after forward)" in line
    # each announced phase is marked done at the announcing thread's next beat after it ends
    # (every BEAT_S; a loaded host delays it: CI12 read one still working after a 1 s sleep)
    deadline = time.time() + 30.0
    while {s.state for s in read_states(tmp_path, TRAIN).values()} != {DONE} and time.time() < deadline:
        time.sleep(0.1)
    assert {s.state for s in read_states(tmp_path, TRAIN).values()} == {DONE}
    assert push_wait_lines(tmp_path) == []


def test_only_a_phase_over_a_second_is_announced_and_it_ends_done(tmp_path):
    rec = RankPhaseRecorder(RankCoords(0, 1))
    rec.rollout_id = 4
    activity = RankActivity(rec, 1, 2, str(tmp_path))
    start = time.time()
    rec.current = ("backward", COMPUTE, "", start)
    activity.tick(start + ANNOUNCE_S / 2)
    assert read_states(tmp_path, TRAIN) == {}  # short phases write nothing
    activity.tick(start + ANNOUNCE_S + 0.1)
    state = read_states(tmp_path, TRAIN)[1]
    assert (state.state, state.phase, state.version, state.entered) == (WORKING, "backward", 4,
                                                                         start)
    activity.tick(start + ANNOUNCE_S + 0.6)
    assert read_states(tmp_path, TRAIN)[1].beat == start + ANNOUNCE_S + 0.6  # renewed
    rec.current = None
    activity.tick(start + 3.0)
    assert read_states(tmp_path, TRAIN)[1].state == DONE
