"""Issue 54 at PP = 2 (Megatron, two gloo ranks, megatron-core's 1F1B schedule): each stage records
its own forward and backward spans inside the schedule and its waits for the other stage apart.
`--inject-fault slow-rank:1:forward:S@0` makes the last stage (pp1) slow in one forward; the
straggler metrics name exactly that stage and phase, and the first stage holds the time in its
wait spans, not in its own work."""
import pytest

from miles.backends.group import ActorGroup
from miles.backends.pack import split_for_ranks
from miles.backends.rank_phases import COMPUTE, WAIT
from miles.run.rank_lanes import rank_straggler_metrics
from miles.run.stragglers import RankCoords, slowest, straggling
from tests.support.actors import config, rollout_like

SLEEP = 1.5


@pytest.fixture(scope="module")
def results(ray_cluster, base_model):
    cfg = config(2, train_backend="megatron", num_steps_per_rollout=1,
                 pipeline_model_parallel_size=2, inject_fault=f"slow-rank:1:forward:{SLEEP}@0")
    group = ActorGroup(cfg, str(base_model))
    samples, advantages = rollout_like()
    try:
        return group.train(split_for_ranks(samples, advantages, cfg.global_batch_size,
                                           cfg.world_size, rollout_id=0))
    finally:
        group.stop()


def test_each_stage_records_its_passes_inside_the_schedule(results):
    coords = [r.rank_spans.coords for r in results]
    assert coords == [RankCoords(0, 0, pp=0), RankCoords(0, 0, pp=1)]
    for result in results:
        spans = result.rank_spans.spans
        forwards = [s for s in spans if s[:2] == ("forward", COMPUTE)]
        backwards = [s for s in spans if s[:2] == ("backward", COMPUTE)]
        assert len(forwards) == len(backwards) == 8  # 16 samples in micro-batches of 2


def test_the_slow_stage_is_named_and_the_other_waits_for_it(results):
    metrics = rank_straggler_metrics(results)
    assert set(straggling(metrics)) == {"forward"}, metrics
    assert slowest(metrics, "forward") == RankCoords(0, 0, pp=1)
    assert metrics["straggler/forward/max"] >= SLEEP
    assert metrics["straggler/forward/min"] < SLEEP / 2
    # pp0 sent its activations on and waited for pp1's gradients: a wait, not its own work
    waited = results[0].rank_spans.seconds(WAIT)
    assert waited.get("backward", 0.0) + waited.get("forward", 0.0) >= SLEEP * 0.9, waited
