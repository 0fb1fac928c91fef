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
