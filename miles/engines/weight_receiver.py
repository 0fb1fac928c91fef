"""The engine's side of SGLang's distributed weight update: join a group, receive buckets, stage.

`/init_weights_update_group` joins (gloo only: the embedded engine receives on the CPU),
`/update_weights_from_distributed` receives one bucket (names, dtypes and shapes in the request; the
tensors by broadcast from the group's rank 0) and `/destroy_weights_update_group` leaves.

Where this differs from SGLang: SGLang loads every bucket into the live model as it arrives. Here a
bucket whose request carries `flush_cache: false` is checked and staged only; the bucket with
`flush_cache: true` (SGLang's default, so a lone call behaves as in SGLang) applies everything
staged with it in one swap between two batches, and sets `weight_version` if given. The engine
therefore serves the old weights, whole, until the last bucket of a push, at the cost of holding one
staged copy of what was sent. A refused bucket drops what was staged; the served weights stay as
they were.

A push may come over several groups at once (ours, beyond SGLang): Megatron's pipeline stages each
send their own layers over their own group (`miles-pp_<stage>`), concurrently, every bucket saying
`push_groups` (how many groups the push has). A group's last bucket then only completes its part
of the push (keyed by `weight_version`); the last bucket of the last group to finish applies every
group's part in one swap, so no generation sees one stage's new layers beside another's old ones.
Its answer carries the new version; the earlier groups' last buckets answer with the version
served until then. A name sent by two groups is refused (a tied embedding goes once). A group
that leaves drops its part; a part of another version is dropped when a new push's part arrives.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from miles.engines import weight_update
from miles.engines.weight_update import WeightUpdateError
from miles.serving.weight_group import (DEFAULT_GROUP, DEFAULT_TIMEOUT_S, WeightGroup,
                                        WeightGroupError, parse_dtype, receive)


@dataclass
class JoinRequest:
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = DEFAULT_GROUP
    backend: str = "nccl"  # SGLang's default; refused here with a message saying to send gloo
    timeout_s: float = DEFAULT_TIMEOUT_S  # ours, beyond SGLang: the bound on each wait of the group


@dataclass
class BucketRequest:
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = DEFAULT_GROUP
    flush_cache: bool = True  # true: the last bucket of a push (apply what is staged)
    weight_version: str | None = None
    abort_all_requests: bool = False
    push_groups: int = 1  # ours: the groups the push comes over (one per pipeline stage)


JOIN_TYPES = {"master_address": (str,), "master_port": (int,), "rank_offset": (int,),
              "world_size": (int,), "group_name": (str,), "backend": (str,),
              "timeout_s": (int, float)}
BUCKET_TYPES = {"names": (list,), "dtypes": (list,), "shapes": (list,), "group_name": (str,),
                "flush_cache": (bool,), "weight_version": (str,), "abort_all_requests": (bool,),
                "push_groups": (int,)}


@dataclass
class _Member:
    group: WeightGroup
    staged: dict[str, torch.Tensor] = field(default_factory=dict)
    buckets: int = 0  # buckets staged since the last apply (a refused one is named by its number)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one bucket at a time


@dataclass
class _PushParts:
    """A push over several groups: the parts of the groups whose last bucket is in."""

    version: str
    groups: int
    parts: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # group -> tensors


def _typed(body, cls, types: dict[str, tuple]):
    """The dataclass `cls` from a JSON object, refusing a known field of the wrong type by name."""
    if not isinstance(body, dict):
        raise WeightUpdateError("the request body must be a JSON object")
    for name, allowed in types.items():
        value = body.get(name)
        wrong_bool = isinstance(value, bool) and bool not in allowed  # JSON true is no port number
        if value is not None and (not isinstance(value, allowed) or wrong_bool):
            raise WeightUpdateError(f"{name} has the wrong type: {value!r:.100}")
    known = {k: body[k] for k in cls.__dataclass_fields__ if body.get(k) is not None}
    try:
        return cls(**known)
    except TypeError as exc:  # a required field is missing
        raise WeightUpdateError(f"incomplete request: {exc}") from None


def parse_join(body) -> JoinRequest:
    req = _typed(body, JoinRequest, JOIN_TYPES)
    if req.backend != "gloo":
        raise WeightUpdateError(f"backend {req.backend!r}: the embedded engine joins gloo groups "
                                "only (it receives on the CPU); send \"backend\": \"gloo\"")
    if not 0 < req.rank_offset < req.world_size:
        raise WeightUpdateError(f"rank_offset {req.rank_offset} must be in 1..world_size-1 "
                                f"(world_size {req.world_size}; rank 0 is the sender)")
    if not req.timeout_s > 0:
        raise WeightUpdateError(f"timeout_s must be > 0, got {req.timeout_s}")
    return req


def parse_bucket(body) -> BucketRequest:
    req = _typed(body, BucketRequest, BUCKET_TYPES)
    if not len(req.names) == len(req.dtypes) == len(req.shapes):
        raise WeightUpdateError(f"names, dtypes and shapes differ in length ({len(req.names)}, "
                                f"{len(req.dtypes)}, {len(req.shapes)})")
    for name, dtype, shape in zip(req.names, req.dtypes, req.shapes):
        if not isinstance(name, str) or not _is_shape(shape):
            raise WeightUpdateError(f"tensor {name!r:.100}: give a name and a shape of "
                                    "non-negative integers")
        try:
            parse_dtype(dtype)
        except WeightGroupError as exc:
            raise WeightUpdateError(f"tensor {name!r}: {exc}") from None
    if req.push_groups < 1:
        raise WeightUpdateError(f"push_groups must be >= 1, got {req.push_groups}")
    if req.push_groups > 1 and req.flush_cache and req.weight_version is None:
        raise WeightUpdateError("a push over several groups (push_groups > 1) needs the "
                                "weight_version on each group's last bucket (it keys the push)")
    return req


def _is_shape(shape) -> bool:
    return isinstance(shape, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)


class WeightReceiver:
    """The weight update groups this engine is a member of, by name, with their staged buckets."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._members: dict[str, _Member] = {}
        self._lock = threading.Lock()
        self._push: _PushParts | None = None  # a push over several groups, not complete yet

    def join(self, req: JoinRequest) -> str:
        """Join (blocking until every member has, or the timeout); a group of that name is
        replaced."""
        self.leave(req.group_name)
        group = WeightGroup.join(req.group_name, req.master_address, req.master_port,
                                 req.rank_offset, req.world_size, req.timeout_s)
        with self._lock:
            self._members[req.group_name] = _Member(group)
        return (f"Joined weight update group {req.group_name!r} as rank {req.rank_offset} of "
                f"{req.world_size}.")

    def leave(self, name: str) -> bool:
        with self._lock:
            member = self._members.pop(name, None)
            if self._push is not None:  # its part would be out of step with what it sends next
                self._push.parts.pop(name, None)
        if member is not None:
            member.group.close()
        return member is not None

    def receive_bucket(self, req: BucketRequest) -> dict[str, torch.Tensor] | None:
        """Receive and check one bucket; stage it, or (the last bucket) return everything staged,
        to apply (over several groups: once every group's part is in). A timeout leaves the group
        (it is out of step); a refused bucket drops what was staged."""
        member = self._members.get(req.group_name)
        if member is None:
            raise WeightUpdateError(f"no weight update group {req.group_name!r}; call "
                                    "/init_weights_update_group first")
        with member.lock:
            number = member.buckets + 1
            what = f"bucket {number} ({len(req.names)} tensors)"
            try:
                named = receive(member.group, req.names, req.dtypes, req.shapes, what)
            except WeightGroupError as exc:
                self.leave(req.group_name)
                raise WeightUpdateError(f"{exc}; the engine left the group, the served weights "
                                        "are kept") from None
            try:
                weight_update.check_tensors(named, self.model, require_all=False)
            except WeightUpdateError as exc:
                member.staged, member.buckets = {}, 0
                raise WeightUpdateError(f"group {req.group_name!r}, {what}: {exc}; the buckets "
                                        "staged so far are dropped and the served weights are "
                                        "kept") from None
            member.staged.update(named)
            member.buckets = number
            if not req.flush_cache:
                return None
            ready, member.staged, member.buckets = member.staged, {}, 0
        return ready if req.push_groups == 1 else self._add_part(req, ready)

    def _add_part(self, req: BucketRequest,
                  part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """One group's whole part of a push over `req.push_groups` groups: all parts to apply
        when it was the last awaited, else None (held until the others are in)."""
        with self._lock:
            push = self._push
            if push is None or (push.version, push.groups) != (req.weight_version,
                                                                req.push_groups):
                push = self._push = _PushParts(req.weight_version, req.push_groups)
            others = [p for group, p in push.parts.items() if group != req.group_name]
            twice = [n for n in part if any(n in p for p in others)]
            if twice:
                self._push = None
                raise WeightUpdateError(
                    f"group {req.group_name!r}: {twice[0]!r} was sent by another group of weight "
                    f"version {req.weight_version!r} too (each tensor comes from one stage); the "
                    "push is dropped and the served weights are kept")
            push.parts[req.group_name] = part
            if len(push.parts) < push.groups:
                return None
            self._push = None
        return {name: t for p in push.parts.values() for name, t in p.items()}

    def staged_buckets(self, name: str) -> int:
        member = self._members.get(name)
        return member.buckets if member is not None else 0

