"""Weight sync over SGLang's distributed protocol: a rank streams HF tensors to engines in buckets.

`--update-weight-transfer-mode broadcast`. The sending rank hosts a gloo group (`miles-pp_<stage>`,
as Miles names one per pipeline stage) of itself (rank 0) and every engine (ranks 1..N, which join
through `/init_weights_update_group`); it keeps the group from push to push. Per bucket of at most
`--update-weight-buffer-size` bytes it posts the names, dtypes and shapes to every engine's
`/update_weights_from_distributed` and broadcasts the tensors, one per name in that order. Only the
last bucket carries `flush_cache: true` and the weight version: the embedded engine stages the
others and swaps everything in with the last (see miles/engines/weight_receiver.py); SGLang applies
each as it comes.

The sender takes any `(name, tensor)` list in HF names, so a pipeline stage's source rank sends its
own layers through its own group. With pipeline parallelism every stage's source rank does, over
`miles-pp_<stage>`, at the same time; each bucket then says how many groups the push has
(`push_groups`), and the engine applies the push once the last bucket of every group is in (the
groups' last buckets but one answer with the version served until then). A failure leaves the
group: the next push builds it again.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable
from urllib.parse import urlparse

import httpx
import torch

from miles.serving.auth import bearer
from miles.serving.control_http import control_client
from miles.serving.weight_group import DEFAULT_TIMEOUT_S, WeightGroup, dtype_name, host_store

DEFAULT_BUFFER_BYTES = 512 * 2**20  # Miles' --update-weight-buffer-size
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class WeightBroadcastError(RuntimeError):
    """A broadcast push failed; the message names the group, the bucket and the engine."""


Named = list[tuple[str, torch.Tensor]]


def plan_buckets(named: Named, buffer_bytes: int) -> list[Named]:
    """Consecutive tensors in buckets of at most `buffer_bytes`; a larger tensor goes alone."""
    if buffer_bytes <= 0:
        raise ValueError(f"--update-weight-buffer-size must be > 0 bytes, got {buffer_bytes}")
    buckets: list[Named] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if not buckets or size + nbytes > buffer_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((name, tensor))
        size += nbytes
    return buckets


@dataclass
class PushStats:
    """One push: seconds and bytes per bucket, and the whole push's."""

    bucket_seconds: list[float] = field(default_factory=list)
    bucket_bytes: list[int] = field(default_factory=list)
    seconds: float = 0.0
    connect_seconds: float = 0.0  # building the group (first push, or after a failure); else 0
    applied: list[str] = field(default_factory=list)  # engines that serve the push's version now

    def metrics(self) -> dict[str, float]:
        """Journal keys: per-bucket {min,p50,max} seconds and bytes, the total bytes and GB/s."""
        total = float(sum(self.bucket_bytes))
        out = {"perf/update_weights_buckets": float(len(self.bucket_bytes)),
               "perf/update_weights_bytes": total,
               "perf/update_weights_gb_per_s": total / self.seconds / 1e9 if self.seconds else 0.0,
               "perf/update_weights_connect_time": self.connect_seconds}
        for key, values in (("bucket_time", self.bucket_seconds),
                            ("bucket_bytes", self.bucket_bytes)):
            if values:
                out.update({f"perf/update_weights_{key}/min": float(min(values)),
                            f"perf/update_weights_{key}/p50": float(statistics.median(values)),
                            f"perf/update_weights_{key}/max": float(max(values))})
        return out

    def stage_metrics(self, stage: int) -> dict[str, float]:
        """One pipeline stage's group: its send's seconds (joining included) and bytes."""
        return {f"perf/update_weights_pp_{stage}_time": self.connect_seconds + self.seconds,
                f"perf/update_weights_pp_{stage}_bytes": float(sum(self.bucket_bytes))}


def merge_stats(stages: list[PushStats], seconds: float) -> PushStats:
    """The push over every stage's group as one: their buckets together, `seconds` the wall time
    of the whole send (the stages send at once), joining the slowest stage's."""
    merged = PushStats(seconds=seconds)
    for stats in stages:
        merged.bucket_seconds += stats.bucket_seconds
        merged.bucket_bytes += stats.bucket_bytes
        merged.applied += [url for url in stats.applied if url not in merged.applied]
    merged.connect_seconds = max((stats.connect_seconds for stats in stages), default=0.0)
    return merged


def sender_address(engine_urls: list[str]) -> str:
    """Where engines reach the sender's store: loopback when they all run here, else this node."""
    if all(urlparse(url).hostname in LOOPBACK for url in engine_urls):
        return "127.0.0.1"
    import ray

    return ray.util.get_node_ip_address()


class WeightBroadcaster:
    """Rank 0 of one weight update group with `engine_urls` (one receiving rank each); the group
    is kept between pushes."""

    def __init__(self, engine_urls: list[str], token: str | None = None,
                 group_name: str = "miles-pp_0", timeout_s: float = DEFAULT_TIMEOUT_S,
                 push_groups: int = 1):
        self.engine_urls, self.token = list(engine_urls), token
        self.group_name, self.timeout_s = group_name, timeout_s
        self.push_groups = push_groups  # the groups each push comes over (this one among them)
        self.group: WeightGroup | None = None

    def push(self, named: Named, buffer_bytes: int, version: str,
             on_bucket: Callable[[int, int], None] | None = None) -> PushStats:
        """Send `named` in buckets; the engines serve `version` once the last bucket is in.
        `on_bucket(n, total)` runs after each bucket is in (progress; a test looks at the engine
        between buckets). A push over a kept group that fails is tried once more on a fresh
        group: an engine that restarted since the last push no longer knows the group (nothing
        was applied: an engine applies only with the last bucket, and a repeat is the same)."""
        kept = self.group is not None
        try:
            return self._push(named, buffer_bytes, version, on_bucket)
        except WeightBroadcastError:
            if not kept:
                raise
            return self._push(named, buffer_bytes, version, on_bucket)

    def _push(self, named: Named, buffer_bytes: int, version: str,
              on_bucket: Callable[[int, int], None] | None) -> PushStats:
        stats = PushStats()
        if self.group is None:
            start = time.perf_counter()
            self.connect()
            stats.connect_seconds = time.perf_counter() - start
        buckets = plan_buckets(named, buffer_bytes)
        start = time.perf_counter()
        try:
            for index, bucket in enumerate(buckets):
                last = index == len(buckets) - 1
                began = time.perf_counter()
                calls = self._send_bucket(bucket, index + 1, len(buckets),
                                          version if last else None)
                stats.bucket_seconds.append(time.perf_counter() - began)
                stats.bucket_bytes.append(sum(t.numel() * t.element_size() for _, t in bucket))
                if last:  # the last group of the push to finish: its answers carry the version
                    stats.applied = [c.url for c in calls
                                     if c.answer.get("weight_version", version) == version]
                if on_bucket is not None:
                    on_bucket(index + 1, len(buckets))
        except BaseException:
            self.close()  # out of step with the engines: the next push joins a fresh group
            raise
        stats.seconds = time.perf_counter() - start
        return stats

    def connect(self) -> None:
        """Host the store, have every engine join through HTTP, and join as rank 0 meanwhile."""
        world, address = 1 + len(self.engine_urls), sender_address(self.engine_urls)
        store = host_store(address, world, self.timeout_s)
        body = {"master_address": address, "master_port": store.port, "world_size": world,
                "group_name": self.group_name, "backend": "gloo", "timeout_s": self.timeout_s}
        joined: list[WeightGroup] = []

        def join() -> None:
            joined.append(WeightGroup(self.group_name, store, 0, world, self.timeout_s))

        bodies = [{**body, "rank_offset": 1 + i} for i in range(len(self.engine_urls))]
        self._together("init_weights_update_group", bodies, join, "joining")
        self.group = joined[0]

    def close(self) -> None:
        """Leave the group; each engine is asked to leave it too (one that cannot answer is
        left alone)."""
        if self.group is None:
            return
        self.group.close()
        self.group = None
        calls = [_Call.post(url, "destroy_weights_update_group", {"group_name": self.group_name},
                            self.token, min(10.0, self.timeout_s)) for url in self.engine_urls]
        for call in calls:
            call.thread.start()
        for call in calls:
            call.thread.join()

    def _send_bucket(self, bucket: Named, number: int, total: int,
                     version: str | None) -> list["_Call"]:
        tensors = [t.detach().to("cpu").contiguous() for _, t in bucket]
        meta = {"names": [n for n, _ in bucket], "dtypes": [dtype_name(t.dtype) for t in tensors],
                "shapes": [list(t.shape) for t in tensors], "group_name": self.group_name,
                "flush_cache": version is not None}
        if version is not None:
            meta["weight_version"] = str(version)
        if self.push_groups > 1:  # ours: SGLang's request has no such field
            meta["push_groups"] = self.push_groups
        what = f"bucket {number} of {total}"
        calls = self._together("update_weights_from_distributed", [meta] * len(self.engine_urls),
                               lambda: self.group.broadcast(tensors, what), what)
        # the last bucket's answers carry the version now served (the embedded engine's do;
        # SGLang's carry none): one that differs did not apply the push, unless other groups of
        # the push are still to come (the caller checks that every engine applied it)
        wrong = [f"engine {c.url} serves {c.answer['weight_version']!r}" for c in calls
                 if version is not None and c.answer.get("weight_version", version) != version]
        if wrong and self.push_groups == 1:
            raise WeightBroadcastError(f"weight update group {self.group_name!r}, {what}: "
                                       f"{'; '.join(wrong)}, not {version!r}")
        return calls

    def _together(self, path: str, bodies: list[dict], work: Callable[[], None],
                  what: str) -> list["_Call"]:
        """Post each engine its body (its answer waits for the collective) while `work` runs this
        side of it; done when all succeeded, failed as soon as either side failed (the other
        side's wait is bounded by the group's timeout)."""
        changed = threading.Event()
        calls = [_Call.post(url, path, body, self.token, self.timeout_s + 30.0, changed)
                 for url, body in zip(self.engine_urls, bodies)]
        own = _Call(work, changed, "miles-weight-send")
        for call in [*calls, own]:
            call.thread.start()
        while True:
            changed.wait()
            changed.clear()
            failed = [c for c in calls if c.done and c.error is not None]
            if failed or own.error is not None or own.done and all(c.done for c in calls):
                break
        if own.error is not None:
            _settle(calls, changed, min(10.0, self.timeout_s))
            failed = [c for c in calls if c.done and c.error is not None]
        reasons = [own.error] if own.error is not None else []
        reasons += [f"engine {c.url} /{c.path} failed: {c.error}" for c in failed]
        if own.error is not None:  # this side gave up waiting: an engine still silent is why
            reasons += [f"engine {c.url} never answered /{c.path} (stopped or hung)"
                        for c in calls if not c.done]
        if reasons:
            raise WeightBroadcastError(f"weight update group {self.group_name!r}, {what}: "
                                       + "; ".join(reasons))
        return calls


def _settle(calls: list["_Call"], changed: threading.Event, grace_s: float) -> None:
    """Give the engines' calls `grace_s` to end: a live engine whose wait in the group failed
    with this side's answers with its error then; one that stays silent is stopped or hung."""
    until = time.monotonic() + grace_s
    while not all(c.done for c in calls) and time.monotonic() < until:
        changed.wait(max(0.0, until - time.monotonic()))
        changed.clear()


class _Call:
    """`work` on its own daemon thread: `error` says why it failed (None: it succeeded), `done`
    that it ended, and `changed` (when given) is set then."""

    def __init__(self, work: Callable[[], None], changed: threading.Event | None, name: str):
        self.url = self.path = ""
        self.answer: dict = {}  # a POST's JSON answer, once it succeeded
        self.error: str | None = None
        self.done = False
        self.thread = threading.Thread(target=self._run, args=(work, changed), daemon=True,
                                       name=name)

    @classmethod
    def post(cls, url: str, path: str, body: dict, token: str | None, timeout: float,
             changed: threading.Event | None = None) -> "_Call":
        """A POST of `body` to an engine; any answer but HTTP 200 with success true fails it."""
        call = cls(lambda: call._post(body, token, timeout), changed, f"miles-weight-{path}")
        call.url, call.path = url, path
        return call

    def _run(self, work: Callable[[], None], changed: threading.Event | None) -> None:
        try:
            work()
        except Exception as exc:  # reported by whoever waits on the call
            self.error = str(exc)
        finally:
            self.done = True
            if changed is not None:
                changed.set()

    def _post(self, body: dict, token: str | None, timeout: float) -> None:
        try:
            response = control_client().post(f"{self.url}/{self.path}", json=body,
                                             headers=bearer(token), timeout=timeout)
            answer: Any = response.json() if response.content else {}
        except (httpx.HTTPError, ValueError) as exc:
            raise RuntimeError(repr(exc)) from None
        if response.status_code != 200 or not isinstance(answer, dict) or not answer.get("success"):
            message = answer.get("message", answer) if isinstance(answer, dict) else answer
            raise RuntimeError(f"HTTP {response.status_code}: {message}")
        self.answer = answer


@dataclass(frozen=True)
class SendTarget:
    """Where and how a rank sends its weights (what WeightSync hands rank 0 for each push)."""

    engine_urls: tuple[str, ...]
    token: str | None
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    group_name: str = "miles-pp_0"
    timeout_s: float = DEFAULT_TIMEOUT_S
    push_groups: int = 1  # the groups the push comes over: one per pipeline stage

    def for_stage(self, stage: int, stages: int) -> "SendTarget":
        """The target of pipeline stage `stage`'s source rank: its own group, `stages` in all."""
        return replace(self, group_name=stage_group(stage), push_groups=stages)


def stage_group(stage: int) -> str:
    """The weight update group of pipeline stage `stage` (Miles' name)."""
    return f"miles-pp_{stage}"


class RankSender:
    """A training rank's side: the HF weights it exported for the next push, and its group (kept
    between pushes to the same engines, rebuilt for others)."""

    def __init__(self):
        self.outgoing: Named | None = None
        self.broadcaster: WeightBroadcaster | None = None

    def stage(self, state: dict[str, torch.Tensor] | None) -> None:
        self.outgoing = None if state is None else list(state.items())

    def send(self, target: SendTarget, version: int) -> PushStats:
        """Push what was staged as `version` (its buckets' seconds and bytes, the engines that
        serve it now)."""
        if self.outgoing is None:
            raise WeightBroadcastError("no weights are staged on this rank: stage_weights runs on "
                                       "every rank first, and only the source rank sends")
        b = self.broadcaster
        wanted = (target.engine_urls, target.token, target.group_name, target.timeout_s,
                  target.push_groups)
        if b is None or (tuple(b.engine_urls), b.token, b.group_name, b.timeout_s,
                         b.push_groups) != wanted:
            if b is not None:
                b.close()
            b = self.broadcaster = WeightBroadcaster(list(target.engine_urls), target.token,
                                                     target.group_name, target.timeout_s,
                                                     target.push_groups)
        try:
            return b.push(self.outgoing, target.buffer_bytes, str(version))
        finally:
            self.outgoing = None  # sent or not, the next push exports afresh
