"""Profiling windows on real training ranks (FSDP and Megatron as Ray actors), driven by the trainer's
`RunProfiler`: traces per target and rank with ProfilerStep markers for exactly the window's rollouts,
the target's spans, the memory file, summaries.jsonl, and nothing again after the window passed."""
import gzip
import json
import pickle

import pytest
import ray
from profiling_helpers import made_up_rollout, profiling_config

from miles.backends.group import ActorGroup
from miles.backends.pack import split_for_ranks
from miles.profiling.driver import RunProfiler
from miles.profiling.rank import _IDLE, RankProfiler
from miles.profiling.summary import read_summaries

TARGETS = ["train_overall", "train_actor", "train_log_probs"]
SPANS = {"train_overall": {"rollout", "log_probs", "actor_train", "update_weights", "checkpoint"},
         "train_actor": {"actor_train"}, "train_log_probs": {"log_probs"}}


def trace_events(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def steps_and_spans(path):
    events = trace_events(path)
    steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    spans = {e["name"] for e in events if e.get("cat") == "user_annotation"} - set(steps)
    return steps, spans, events


def run_iterations(profiler, group, config, rollout_ids):
    """What the trainer does per iteration, with the ranks' training as the only real work."""
    samples, advantages = made_up_rollout()
    for rollout_id in rollout_ids:
        profiler.begin_iteration(rollout_id)
        with profiler.phase("rollout"):
            batches = split_for_ranks(samples, advantages, config.global_batch_size, config.world_size, rollout_id)
        group.train(batches)
        with profiler.phase("update_weights"):
            group.call("set_weight_version", rollout_id + 1)
        with profiler.phase("checkpoint"):
            group.call("info")


@pytest.fixture(scope="module")
def groups(ray_cluster, base_model, tmp_path_factory):
    """FSDP on two ranks and Megatron on one, shared by this module's tests (windows come from the driver)."""
    made = {}
    try:
        for backend, world_size in (("fsdp", 2), ("megatron", 1)):
            config = profiling_config(tmp_path_factory.mktemp(backend), "--train-backend", backend,
                                      "--actor-num-gpus-per-node", str(world_size))
            made[backend] = ActorGroup(config, str(base_model))
        yield made
    finally:
        for group in made.values():
            group.stop()


@pytest.mark.parametrize("backend, world_size, ranks", [("fsdp", 2, [1]), ("megatron", 1, [0])])
def test_window_traces_each_target_on_the_chosen_ranks(backend, world_size, ranks, make_config, groups, tmp_path):
    memory = tmp_path / "mem" / "snapshot.pickle"
    config = make_config("--train-backend", backend, "--actor-num-gpus-per-node", str(world_size),
                         "--use-pytorch-profiler", "--profile-step-start", "1", "--profile-step-end", "3",
                         "--profile-target", *TARGETS, "--profile-ranks", *map(str, ranks),
                         "--record-memory-history", "--memory-snapshot-path", str(memory))
    run_dir = tmp_path / "run"
    group = groups[backend]
    profiler = RunProfiler(config, run_dir, group.actors, engine_urls=[])
    run_iterations(profiler, group, config, [0, 1, 2, 3])  # rollout 3 closes the window [1, 3)
    for target in TARGETS:
        for rank in range(world_size):
            path = run_dir / "profiler" / f"{target}_rollouts_1-3" / f"rank{rank}.pt.trace.json.gz"
            assert path.exists() == (rank in ranks), path
            if rank not in ranks:
                continue
            steps, spans, events = steps_and_spans(path)
            assert steps == ["ProfilerStep#1", "ProfilerStep#2"], target
            assert SPANS[target] <= spans, (target, spans)
            assert any(e.get("cat") == "cpu_op" and e["name"] == "aten::mm" for e in events)
    # rank 0 writes --memory-snapshot-path, rank r NAME_rank<r>.EXT beside it
    written = memory if ranks[0] == 0 else memory.with_name(f"snapshot_rank{ranks[0]}.pickle")
    snapshot = pickle.loads(written.read_bytes())
    assert snapshot["device"] == "cpu" and snapshot["events"] and snapshot["peak_allocated"] > 0
    summaries = read_summaries(run_dir)
    assert {(s.target, s.rank, s.start, s.end) for s in summaries} == {(t, r, 1, 3) for t in TARGETS for r in ranks}
    overall = next(s for s in summaries if s.target == "train_overall")
    assert set(overall.spans) == SPANS["train_overall"] and overall.top_ops[0]["self_cpu_ms"] > 0
    assert overall.trace == f"profiler/train_overall_rollouts_1-3/rank{ranks[0]}.pt.trace.json.gz"
    profiler.close()

    # A resumed run (rollout 3 onwards) does not profile the window again.
    lines = (run_dir / "profiler" / "summaries.jsonl").read_text()
    again = RunProfiler(config, run_dir, group.actors, engine_urls=[])
    run_iterations(again, group, config, [3])
    again.close()
    assert again.summaries == [] and (run_dir / "profiler" / "summaries.jsonl").read_text() == lines


def test_outside_a_window_sections_are_the_shared_no_op():
    profiler = RankProfiler(rank=0)
    assert profiler.section("train_actor", 5) is _IDLE and profiler.span("rollout") is _IDLE
    assert profiler.close() == []


def test_a_failing_export_is_reported_once_and_training_goes_on(make_config, groups, tmp_path, capsys):
    blocker = tmp_path / "tb"
    config = make_config("--use-pytorch-profiler", "--profile-step-start", "0", "--profile-step-end", "1",
                         "--profile-target", "train_actor", "--tensorboard-dir", str(blocker))
    blocker.write_text("a file where the trace directory should be")  # made after start-up checks: a disk error
    group = groups["megatron"]
    steps = ray.get(group.actors[0].info.remote()).optimizer_steps
    profiler = RunProfiler(config, tmp_path / "run", group.actors, engine_urls=[])
    run_iterations(profiler, group, config, [0, 1, 2])
    profiler.close()
    out = capsys.readouterr().out
    assert out.count("[profiler] error") == 1 and "training goes on" in out
    assert ray.get(group.actors[0].info.remote()).optimizer_steps == steps + 6  # all three rollouts trained

def test_a_window_requested_while_training_opens_at_its_first_rollout(make_config, groups, tmp_path):
    config = make_config()  # no profiling flags: only the requested window profiles
    group = groups["megatron"]
    profiler = RunProfiler(config, tmp_path / "run", group.actors, engine_urls=[])
    run_iterations(profiler, group, config, [0])
    profiler.request_window(1, 2)  # what a health watch asks after a red flag at rollout 0
    run_iterations(profiler, group, config, [1, 2])
    profiler.close()
    assert [(s.target, s.start, s.end) for s in profiler.summaries] == [("train_overall", 1, 2)]
    steps, _, _ = steps_and_spans(tmp_path / "run" / "profiler" / "train_overall_rollouts_1-2" / "rank0.pt.trace.json.gz")
    assert steps == ["ProfilerStep#1"]


def test_requested_window_survives_into_the_next_trainer_and_resumes_where_it_left(make_config, groups, tmp_path):
    config = make_config()
    group = groups["megatron"]
    first = RunProfiler(config, tmp_path / "run", group.actors, engine_urls=[])
    first.request_window(2, 5)
    run_iterations(first, group, config, [0, 1, 2])
    first.close()  # a chunk ends inside the window: rollout 2 profiled
    second = RunProfiler(config, tmp_path / "run", group.actors, engine_urls=[])  # the next chunk, resumed at 3
    run_iterations(second, group, config, [3, 4, 5])
    second.close()
    assert [(s.start, s.end) for s in first.summaries + second.summaries] == [(2, 3), (3, 5)]
    assert first.summaries[0].trace == "profiler/train_overall_rollouts_2-3/rank0.pt.trace.json.gz"
    steps, _, _ = steps_and_spans(tmp_path / "run" / "profiler" / "train_overall_rollouts_3-5" / "rank0.pt.trace.json.gz")
    assert steps == ["ProfilerStep#3", "ProfilerStep#4"]
