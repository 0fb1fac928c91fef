"""A training rank's set-up is one `PPORank.init`/`load_base` for every backend (FSDP and Megatron each had
a copy): join the world, lay out the parallelism, seed, build, start the optimizer. A backend supplies
only `_init_parallel` and `_build_models`."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from miles.backends.fsdp.actor import FSDPTrainActor
from miles.backends.megatron.actor import MegatronTrainActor
from miles.backends.ppo import PPORank
from miles.config import parse_config
from miles.run.phases import remove_phase_hook
from miles.serving.process import free_port

SEED = 7


class Recording(PPORank):
    """A backend with a two-by-two model that records what the set-up asked of it."""

    def __init__(self, config):
        super().__init__(config, rank=0, world_size=1)
        self.calls = []

    def _init_parallel(self) -> None:
        self.calls.append(("parallel", dist.is_initialized()))

    def _build_models(self, model_path: str) -> None:
        self.calls.append(("build", model_path, torch.rand(1).item()))  # the draw shows the rank was seeded
        self.model = torch.nn.Linear(2, 2)


def test_init_joins_the_world_then_lays_out_then_builds_seeded(tmp_path):
    rank = Recording(parse_config(["--seed", str(SEED)]))
    try:
        info = rank.init(str(tmp_path), "127.0.0.1", free_port())
        torch.manual_seed(SEED + 0)
        seeded = torch.rand(1).item()
        assert rank.calls == [("parallel", True), ("build", str(tmp_path), seeded)]
        assert (info.rank, info.world_size, info.weight_version, info.optimizer_steps) == (0, 1, 0, 0)
        assert rank.model_path == Path(tmp_path) and isinstance(rank.optimizer, torch.optim.AdamW)
        rank.optimizer_steps, rank.weight_version = 3, 3
        again = rank.load_base(str(tmp_path))  # back to the base: same seed, fresh optimizer, version 0
        assert rank.calls[-1] == ("build", str(tmp_path), seeded)
        assert (again.weight_version, again.optimizer_steps) == (0, 0)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        remove_phase_hook(rank.profiler.span)


def test_the_backends_supply_only_their_layout_and_models():
    for backend in (FSDPTrainActor, MegatronTrainActor):
        own = set(vars(backend))
        assert {"_init_parallel", "_build_models"} <= own, backend.__name__
        assert not own & {"init", "load_base"}, f"{backend.__name__} has its own copy of the set-up"


def test_rank_0_holds_the_rendezvous_port_from_the_moment_it_is_picked(tmp_path):
    """A port picked free and bound later can be taken in between (EADDRINUSE at init, seen on a busy machine):
    `open_store` binds it as it picks it, and `init` serves the group on that store."""
    import errno
    import socket

    import pytest

    rank = Recording(parse_config(["--seed", str(SEED)]))
    try:
        port = rank.open_store("127.0.0.1")
        with socket.socket() as other, pytest.raises(OSError) as taken:
            other.bind(("127.0.0.1", port))  # what another process's bind would meet before init
        assert taken.value.errno == errno.EADDRINUSE
        rank.init(str(tmp_path), "127.0.0.1", port)
        assert dist.is_initialized() and dist.get_world_size() == 1
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        remove_phase_hook(rank.profiler.span)

