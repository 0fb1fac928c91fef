"""A weight export or checkpoint gathers the model-parallel group's shards on its first member only
(`gather.gather_to_first`): the writer holds the whole model, the other members nothing of it (on
every member, SmolLM2 at TP=3 ran out of memory in a weight push on a 23 GB host)."""
import torch.distributed as dist
import torch.multiprocessing as mp

from miles.backends.megatron.gather import gather_to_first
from miles.serving.process import free_port


def _rank(rank: int, world: int, port: int, queue) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        tail = dist.new_group([1, 2])  # a group whose first member is not global rank 0
        whole = gather_to_first(f"from {rank}", dist.group.WORLD)
        part = gather_to_first(f"from {rank}", tail) if rank in (1, 2) else "not a member"
        queue.put((rank, whole, part))
    finally:
        dist.destroy_process_group()


def test_only_the_groups_first_member_receives_the_parts():
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, 3, port, queue)) for r in range(3)]
    for p in procs:
        p.start()
    answers = {rank: (whole, part) for rank, whole, part in
               (queue.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
    assert answers[0] == (["from 0", "from 1", "from 2"], "not a member")
    assert answers[1] == (None, ["from 1", "from 2"])  # in group rank order, on the group's first
    assert answers[2] == (None, None)


def _shards(rank: int, same: bool) -> dict:
    import torch

    g = torch.Generator().manual_seed(rank)
    shards = {"a.weight": torch.randn(3, 4, generator=g),
              "a.norm": torch.randn(4, generator=g).to(torch.bfloat16),
              "b.index": torch.arange(5) * (rank + 1),
              "b.weight": torch.randn(2, 2, generator=g)}
    if not same and rank == 1:
        shards["b.weight"] = torch.randn(3, 2, generator=g)  # another shape: sent as objects
    return shards


def _plain(parts):
    """Shards as plain data: tensors through a queue pass file descriptors that die with the
    sending process (CI11: the parent read them after a child had exited)."""
    import torch

    if not isinstance(parts, list):
        return parts
    return [{name: (str(t.dtype), tuple(t.shape), t.to(torch.float64).flatten().tolist())
             for name, t in shards.items()} for shards in parts]


def _tensor_rank(rank: int, world: int, port: int, queue) -> None:
    from miles.backends.megatron.gather import gather_tensors_to_first

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        tail = dist.new_group([1, 2])
        for same in (True, False):
            whole = gather_tensors_to_first(_shards(rank, same), dist.group.WORLD)
            part = (gather_tensors_to_first(_shards(rank, same), tail) if rank in (1, 2)
                    else "not a member")
            queue.put((rank, same, _plain(whole), _plain(part)))
    finally:
        dist.destroy_process_group()


def test_tensor_shards_reach_the_first_member_as_they_were():
    """A stage's TP shards (same names, shapes, dtypes) travel as flat buffers per dtype; shards
    that differ fall back to objects; either way the first member gets each member's tensors
    bit for bit, in group rank order and in the members' own name order."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_tensor_rank, args=(r, 3, port, queue)) for r in range(3)]
    for p in procs:
        p.start()
    answers = {(rank, same): (whole, part) for rank, same, whole, part in
               (queue.get(timeout=120) for _ in range(2 * len(procs)))}
    for p in procs:
        p.join(timeout=60)
    for same in (True, False):
        whole, part = answers[(0, same)]
        assert part == "not a member"
        # every tensor bit for bit (float64 holds bfloat16, float32 and small int64 exactly),
        # with its dtype and shape, in group rank order and each member's own name order
        expected = _plain([_shards(r, same) for r in range(3)])
        assert whole == expected
        assert [list(shards) for shards in whole] == [list(_shards(r, same)) for r in range(3)]
        assert answers[(1, same)][0] is None and answers[(2, same)] == (None, None)
        assert answers[(1, same)][1] == _plain([_shards(1, same), _shards(2, same)])
