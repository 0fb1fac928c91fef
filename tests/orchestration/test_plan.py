"""Chunk planning: coverage, sizes, and the profiling window as its own chunk."""
from __future__ import annotations

import pytest

from miles.cluster.chunks import Chunk, plan_chunks, plan_for
from miles.config import parse_config


def covered(chunks: list[Chunk]) -> list[int]:
    return [i for c in chunks for i in range(c.first, c.stop)]


def test_chunks_cover_every_rollout_once_in_order():
    chunks = plan_chunks(7, 3)
    assert chunks == [Chunk(0, 3), Chunk(3, 6), Chunk(6, 7)]
    assert covered(chunks) == list(range(7))


def test_profiling_window_is_exactly_one_chunk():
    # window [10, 12) inside chunks of 4: 0-3, 4-7, 8-9 | 10-11 profiled | 12-15, 16-17
    chunks = plan_chunks(18, 4, window=(10, 12))
    assert [c for c in chunks if c.profiled] == [Chunk(10, 12, profiled=True)]
    assert chunks == [Chunk(0, 4), Chunk(4, 8), Chunk(8, 10), Chunk(10, 12, True), Chunk(12, 16), Chunk(16, 18)]
    assert covered(chunks) == list(range(18))


def test_window_longer_than_a_chunk_is_not_split_and_is_clipped_to_the_run():
    chunks = plan_chunks(6, 2, window=(3, 99))
    assert chunks == [Chunk(0, 2), Chunk(2, 3), Chunk(3, 6, profiled=True)]


def test_window_outside_the_run_profiles_nothing():
    assert not any(c.profiled for c in plan_chunks(4, 2, window=(10, 12)))


def test_plan_follows_the_flags():
    config = parse_config(["--num-rollout", "5", "--chunk-size", "2", "--use-pytorch-profiler",
                           "--profile-step-start", "1", "--profile-step-end", "2"])
    assert plan_for(config) == [Chunk(0, 1), Chunk(1, 2, True), Chunk(2, 4), Chunk(4, 5)]


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="chunk_size"):
        plan_chunks(4, 0)



def test_chunk_task_runs_are_named_by_the_iters_the_rows_print():
    # review N18: `train_chunk[80-100]` beside rows `iter 80..99` read as 21 rollouts; both ends included now
    from prefect._internal.engine import resolve_custom_task_run_name

    from tasks.training import profile_window, train_chunk

    def name(task, chunk):
        return resolve_custom_task_run_name(task, {"config": None, "chunk": chunk, "services": None})

    assert name(train_chunk, Chunk(80, 100)) == "train_chunk[iter 80..99]"
    assert name(train_chunk, Chunk(5, 6)) == "train_chunk[iter 5]"
    assert name(profile_window, Chunk(10, 12, profiled=True)) == "profile_window[iter 10..11]"
