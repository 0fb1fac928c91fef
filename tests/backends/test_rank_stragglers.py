"""Two FSDP ranks as Ray actors: the straggler metrics name the rank that `--inject-fault slow-rank`
slows and its phase, and no rank of the healthy iterations around it; the others wait for it in
wait spans, not in their own work.

FSDP's passes hold collectives (parameter gathers, gradient reduce-scatters): the fault slows rank
1's forward, so without the mark after each pass (settled into waits by the group) rank 0's next
backward would hold that wait and name rank 0 in `backward`."""
import pytest
import ray

from miles.backends.group import ActorGroup
from miles.backends.pack import split_for_ranks
from miles.backends.rank_phases import WAIT, clock_offset
from miles.run.stragglers import RankCoords, slowest, straggling
from miles.run.rank_lanes import rank_straggler_metrics
from tests.support.actors import config, rollout_like

SLOW_ROLLOUT, SLEEP = 1, 1.5
OFFSETS: list[float] = []


def stragglers(metrics):
    """The phases with a straggler by `straggling`'s bounds (1.5x, 0.25 s over the median)."""
    return set(straggling(metrics))


@pytest.fixture(scope="module")
def iterations(ray_cluster, base_model):
    cfg = config(2, inject_fault=f"slow-rank:1:forward:{SLEEP}@{SLOW_ROLLOUT}")
    group = ActorGroup(cfg, str(base_model))
    samples, advantages = rollout_like()
    try:
        trained = [group.train(split_for_ranks(samples, advantages, cfg.global_batch_size,
                                               cfg.world_size, rollout_id=r)) for r in range(3)]
        # the offset a multi-host group measures, forced on one host (one clock: about 0)
        OFFSETS[:] = ray.get([a.__ray_call__.remote(lambda rank: clock_offset(force=True))
                              for a in group.actors])
        return trained
    finally:
        group.stop()


def test_the_slow_rank_is_named_with_its_phase(iterations):
    metrics = rank_straggler_metrics(iterations[SLOW_ROLLOUT])
    assert stragglers(metrics) == {"forward"}, metrics
    assert slowest(metrics, "forward") == RankCoords(node=0, dp=1)  # --actor-num-gpus-per-node 2
    # the slow rank's own forward holds its sleep; the other's holds none (its forward work can be
    # longer than the slow rank's, so their difference may fall a few ms short of SLEEP: CI3)
    assert metrics["straggler/forward/max"] >= SLEEP
    assert metrics["straggler/forward/min"] < SLEEP / 2
    # rank 0 waited for it after that forward, in a wait span
    waited = iterations[SLOW_ROLLOUT][0].rank_spans.seconds(WAIT)
    assert waited.get("forward", 0.0) >= SLEEP * 0.9, waited


def test_healthy_iterations_name_no_straggler(iterations):
    for results in (iterations[0], iterations[2]):
        metrics = rank_straggler_metrics(results)
        phases = {k.split("/")[1] for k in metrics}
        assert {"log_probs", "forward", "backward", "grad_reduce", "optimizer"} <= phases
        assert stragglers(metrics) == set(), metrics


def test_every_rank_reports_its_coordinates(iterations):
    names = [r.rank_spans.coords.name for r in iterations[0]]
    assert names == ["node0/dp0/pp0/tp0", "node0/dp1/pp0/tp0"]


def test_ranks_measure_their_clock_against_rank_0s(iterations):
    # what ranks on other hosts measure once at the start (here forced: one host, one clock)
    assert OFFSETS[0] == 0.0 and abs(OFFSETS[1]) < 0.05, OFFSETS
    assert all(r.rank_spans.clock_offset == 0.0 for r in iterations[0])  # one host: not measured
