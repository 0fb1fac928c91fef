"""Splitting a rollout across ranks and steps, and combining rank results."""
import pytest

from miles.backends.base import RankTrainResult
from miles.backends.pack import combine, split_for_ranks
from miles.rollout.sample import Sample


def test_split_gives_each_rank_a_slice_of_every_step():
    samples = [Sample(index=i, group_index=i // 2, prompt="p", label=None, tokens=[i, i], response_length=1,
                      rollout_log_probs=[-0.1]) for i in range(8)]
    batches = split_for_ranks(samples, [float(i) for i in range(8)], global_batch_size=4, world_size=2,
                              rollout_id=3)
    assert [b.advantages for b in batches] == [[0.0, 1.0, 4.0, 5.0], [2.0, 3.0, 6.0, 7.0]]
    assert batches[0].step_sizes == [2, 2] and batches[0].global_step_sizes == [4, 4]
    with pytest.raises(ValueError, match="global batches of 3"):
        split_for_ranks(samples, [0.0] * 8, 3, 1, 0)


def test_combine_means_over_all_samples():
    a = RankTrainResult({"train/pg_loss": 2.0}, {"train/grad_norm": [1.0, 3.0]}, 2, 10, 0.1, 0.0, 1.0)
    b = RankTrainResult({"train/pg_loss": 4.0}, {"train/grad_norm": [1.0, 3.0]}, 2, 12, 0.2, 0.0, 2.0)
    out = combine([a, b])
    assert out.metrics == {"train/pg_loss": 1.5, "train/grad_norm": 2.0}
    assert (out.num_tokens, out.log_probs_time, out.actor_train_time) == (22, 0.2, 2.0)
