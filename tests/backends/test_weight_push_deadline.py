"""A weight push cannot hang on a training rank that dies or stops mid-push. Two FSDP ranks train
rollout 0; `--inject-fault kill-rank:1@0` (SIGKILL) or `stall-rank:1@0` (SIGSTOP) hits rank 1 as it
enters the push's weight gather, with rank 0 in that all-gather. Rank 0 fails by its deadline
(--update-weight-timeout) naming the phase, the collective and rank 1 with what became of it; the
push is a WeightSyncError, the ranks are ended (a stopped one too) and the records in
RUN_DIR/collectives (what `miles diagnose` reads) say the same."""
from __future__ import annotations

import os
import time

import pytest

from miles.backends.group import ActorGroup
from miles.backends.sync import WeightSync, WeightSyncError
from miles.diagnose.push_waits import push_wait_lines
from miles.run.collective_waits import FAILED, read_states
from tests.support.actors import config, rollout_like, step

TIMEOUT_S = 5


def process_ends(pid: int, within_s: float = 60.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("fault, fate", [("kill-rank", "died in it"),
                                         ("stall-rank", "stopped answering in it")])
def test_a_push_fails_on_every_rank_naming_the_rank_it_waited_for(ray_cluster, base_model,
                                                                  tmp_path, fault, fate):
    cfg = config(2, inject_fault=f"{fault}:1@0", update_weight_timeout=TIMEOUT_S,
                 run_dir=tmp_path)
    group = ActorGroup(cfg, str(base_model))
    pids = [info.extra["pid"] for info in group.call("info")]
    try:
        step(group, cfg, *rollout_like())  # rollout 0 trained: its push is the fault's
        sync = WeightSync(group, [], None, tmp_path / "weights", in_memory=False)
        started = time.monotonic()
        with pytest.raises(WeightSyncError) as caught:
            sync.push(1)
        took = time.monotonic() - started
    finally:
        group.kill()
    message = str(caught.value)
    print(f"{fault}: the push failed after {took:.1f} s: {message}")
    assert "rank 0: PushDeadlineError: weight push of version 1, phase weight_gather" in message
    assert "all-gather of the FSDP shards" in message
    assert f"rank 1 (node0/dp1/pp0/tp0) {fate}" in message
    assert took < 2 * TIMEOUT_S + 30  # bounded (generously: a loaded machine), not 30 min
    states = read_states(tmp_path)
    assert states[0].state == FAILED and states[0].version == 1
    # miles diagnose reads the same records: rank 0's failure, naming rank 1
    assert any(f"rank 1 (node0/dp1/pp0/tp0) {fate}" in line for line in push_wait_lines(tmp_path))
    assert all(process_ends(pid) for pid in pids)  # a stopped rank is ended too


def test_a_push_fault_must_aim_at_a_rank_of_the_run():
    from miles.config.fields import ConfigError
    from miles.run.faults import check_faults, push_fault

    assert push_fault("kill-rank:1@2,stall-rank@3", 0).kind == "stall-rank"
    with pytest.raises(ConfigError, match="stall-rank:2@0: there is no training rank 2"):
        check_faults("stall-rank:2@0", 2)
