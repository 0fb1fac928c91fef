"""A gloo process group carrying weights from a training rank to engines (SGLang's weight update
group).

Both sides build it from a TCPStore and `ProcessGroupGloo` directly, never through
`init_process_group`: a training rank already has a default group (its training world) that must
stay as it is, and the engine may run beside one too. The sender (rank 0) hosts the store; each
engine joins as `rank_offset` of `world_size`. Every wait is bounded by the group's timeout, and a
timeout is reported naming the group and the side that did not come.

The digest (`state_digest`) is how both sides show they hold the same weights: sha256 over the
sorted names and each tensor's bytes.
"""
from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Iterable

import torch
import torch.distributed as dist

DEFAULT_GROUP = "weight_update_group"  # SGLang's default group_name
DEFAULT_TIMEOUT_S = 300.0
DTYPES = {name: getattr(torch, name) for name in (
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8",
    "bool")}


class WeightGroupError(RuntimeError):
    """Joining or using a weight update group failed; the message names the group and the side."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    """A dtype by SGLang's spelling ("bfloat16"; "torch.bfloat16" too)."""
    found = DTYPES.get(str(name).removeprefix("torch."))
    if found is None:
        raise WeightGroupError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return found


def host_store(address: str, world_size: int, timeout_s: float) -> dist.TCPStore:
    """The sender's rendezvous store, on a port the OS picks as it binds (read it off `.port`)."""
    return dist.TCPStore(address, 0, world_size, is_master=True,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


class WeightGroup:
    """One member of a named weight update group: rank 0 sends, every other rank receives."""

    def __init__(self, name: str, store: dist.Store, rank: int, world_size: int, timeout_s: float):
        self.name, self.rank, self.world_size, self.timeout_s = name, rank, world_size, timeout_s
        self._store = store  # kept: the group's connections were made through it
        try:
            self._pg = dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, world_size,
                                             timedelta(seconds=timeout_s))
        except RuntimeError as exc:
            missing = "the other members" if rank == 0 else "the sender (rank 0) or another member"
            raise WeightGroupError(f"weight update group {name!r}: {missing} did not join rank "
                                   f"{rank} of {world_size} within {timeout_s:g} s "
                                   f"({_first_line(exc)})") from None

    @classmethod
    def join(cls, name: str, address: str, port: int, rank: int, world_size: int,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> "WeightGroup":
        """A receiving member: connect to the sender's store at address:port and join as `rank`."""
        try:
            store = dist.TCPStore(address, port, world_size, is_master=False,
                                  timeout=timedelta(seconds=timeout_s))
        except RuntimeError as exc:
            raise WeightGroupError(f"weight update group {name!r}: the sender's store at "
                                   f"{address}:{port} was not reached within {timeout_s:g} s "
                                   f"({_first_line(exc)})") from None
        return cls(name, store, rank, world_size, timeout_s)

    def broadcast(self, tensors: Iterable[torch.Tensor], what: str) -> None:
        """Broadcast each tensor from rank 0 (in place on receivers), in order, as SGLang's
        receiver expects: one broadcast per named tensor. `what` names the transfer in a timeout's
        message."""
        works = [self._pg.broadcast([t], dist.BroadcastOptions()) for t in tensors]
        try:
            for work in works:
                work.wait()
        except RuntimeError as exc:
            other = "the receivers (engines)" if self.rank == 0 else "the sender (rank 0)"
            raise WeightGroupError(f"weight update group {self.name!r}: {other} did not take part "
                                   f"in {what} within {self.timeout_s:g} s "
                                   f"({_first_line(exc)})") from None

    def close(self) -> None:
        self._pg = None
        self._store = None


def receive(group: WeightGroup, names: list[str], dtypes: list[str], shapes: list[list[int]],
            what: str) -> dict[str, torch.Tensor]:
    """The named tensors of one bucket, received by broadcast from the group's rank 0 (on the
    CPU)."""
    tensors = [torch.empty(tuple(shape), dtype=parse_dtype(dtype))
               for dtype, shape in zip(dtypes, shapes)]
    group.broadcast(tensors, what)
    return dict(zip(names, tensors))


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over the sorted names and each tensor's bytes: equal digests, equal weights."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        # as raw bytes: numpy has no bfloat16
        flat = state[name].detach().to("cpu").contiguous().reshape(-1)
        h.update(flat.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
