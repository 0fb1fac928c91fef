"""Weight sync from the training ranks to every engine, with a new weight version (Miles' "p2p").

Across processes the ranks write an HF checkpoint directory and each engine loads it
(`/update_weights_from_disk`), or with `--update-weight-transfer-mode broadcast` the source rank of
each pipeline stage streams its stage's HF tensors in buckets over its own group
(`miles-pp_<stage>`, SGLang's `/update_weights_from_distributed`; weight_broadcast.py), all
stages at once, and the engines apply the push once every stage is in; co-located, rank 0's full state dict
is pushed in memory. With --use-fault-tolerance a broadcast push also writes the checkpoint
directory: the supervisor brings a relaunched engine, or one that missed a push, up to date from
it (the disk path).
The router is told the new version so it can report which weights serve traffic.

Nothing in a push waits forever: each collective on the ranks (the weight gather) and each engine
call is bounded by --update-weight-timeout; a rank that died or stopped mid-push fails the push on
every other rank within it, with a message naming the phase, the collective and that rank
(`miles.backends.push_deadline`), and the ranks are then ended (their groups are out of step), so
the run's fault-tolerance path starts them afresh from the last checkpoint.

In async training requests are in flight during a push: each engine is paused first (SGLang's
`/pause_generation` with mode `in_place` or `retract`), updated, then continued, so the requests go on
under the new weights instead of holding the update back until they end.
"""
from __future__ import annotations

import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from miles.backends.group import ActorGroup, RankCallError
from miles.backends.weight_broadcast import DEFAULT_BUFFER_BYTES, SendTarget, merge_stats
from miles.record import layout
from miles.serving.auth import bearer
from miles.serving.router_client import RouterClient
from miles.serving.control_http import control_client
from miles.run.collective_waits import STALE_S, gone
from miles.run.engine_stragglers import SpanTail, engine_own_seconds, engine_time_metrics


class WeightSyncError(RuntimeError):
    """An engine or the router did not accept new weights."""


class RanksFailedError(WeightSyncError):
    """A training rank failed mid-push; the ranks were ended (the run's relaunch path starts them
    afresh from the last checkpoint, with or without engine supervision)."""


def _engine_weights():
    from miles.engines import weights  # imported late: the engine side is optional for the backend

    return weights


def push_disk(engine_urls: list[str], model_dir: Path, version: int, token: str | None = None) -> None:
    failures = push_disk_each(engine_urls, model_dir, version, token)[0]
    if failures:
        raise next(iter(failures.values()))


def push_disk_each(engine_urls: list[str], model_dir: Path, version: int, token: str | None = None,
                   timeout_s: float = 600.0) -> tuple[dict[str, Exception], dict[str, float]]:
    """Push to every engine in parallel; the engines that failed, with their error, and each push's seconds."""
    weights = _engine_weights()
    seconds: dict[str, float] = {}

    def push(url: str) -> Exception | None:
        start = time.perf_counter()
        try:
            weights.push_weights_from_disk(url, str(model_dir), str(version), timeout=timeout_s,
                                           token=token)
        except httpx.TimeoutException as exc:  # the deadline passed: name the engine and the wait
            return WeightSyncError(f"engine {url} did not load weight version {version} from disk "
                                   f"within {time.perf_counter() - start:.1f} s (deadline "
                                   f"--update-weight-timeout {timeout_s:g} s): {exc!r}")
        except httpx.TransportError as exc:  # refused or dropped: no deadline to blame
            return WeightSyncError(f"engine {url} could not be reached to load weight version "
                                   f"{version} from disk (after {time.perf_counter() - start:.1f} s): "
                                   f"{exc!r}")
        except Exception as exc:  # reported per engine: with supervision one dead engine must not fail the push
            return exc
        finally:
            seconds[url] = time.perf_counter() - start
        return None

    # one daemon thread per engine, not a thread pool: a pool's exit (and the interpreter's) waits for every
    # push, so a push to a hung engine would keep the run alive after the stall reaction interrupted it
    results: dict[str, Exception | None] = {}
    threads = [threading.Thread(target=lambda u=url: results.__setitem__(u, push(u)), daemon=True,
                                name=f"miles-weight-push-{i}") for i, url in enumerate(engine_urls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # interruptible: the stall reaction's SIGINT ends the wait
    return {url: exc for url, exc in results.items() if exc is not None}, seconds


@contextmanager
def paused(engine_urls: list[str], mode: str | None, token: str | None = None,
           timeout_s: float = 120.0) -> Iterator[None]:
    """Pause every engine's generation in `mode` for the body, continue it after (even on failure);
    None: nothing (a synchronous push has nothing in flight). An engine that cannot be reached is left
    to the push, which reports it."""
    if mode is None:
        yield
        return
    headers = bearer(token)
    reached = []
    for url in engine_urls:
        try:
            response = control_client().post(f"{url}/pause_generation", json={"mode": mode},
                                             headers=headers, timeout=timeout_s)
        except httpx.TransportError:
            continue
        if response.status_code != 200:
            raise WeightSyncError(f"engine {url} refused /pause_generation ({mode}): "
                                  f"{response.status_code} {response.text[:200]}")
        reached.append(url)
    try:
        yield
    finally:
        for url in reached:
            try:
                control_client().post(f"{url}/continue_generation", json={}, headers=headers,
                                      timeout=timeout_s)
            except httpx.TransportError:  # a dead engine: its supervisor relaunches it unpaused
                pass


class WeightSync:
    """Pushes the ranks' current weights to the engines; keeps only the newest exported directory.

    With a `supervisor` (--use-fault-tolerance) it pushes only to the engines that are ready, reports an
    engine that fails the push instead of failing the run, and keeps the directory of the current weights
    (`current()`) for the supervisor to bring a relaunched engine up to date; `lock` keeps the two apart."""

    def __init__(self, group: ActorGroup, engine_urls: list[str], router_url: str | None, export_root: Path,
                 in_memory: bool, admin_token: str | None = None, supervisor=None):
        self.group, self.engine_urls, self.router_url = group, engine_urls, router_url
        self.admin_token = admin_token
        self.router = RouterClient(router_url, admin_token) if router_url is not None else None
        self.export_root, self.in_memory = export_root, in_memory
        self.supervisor = supervisor
        # --update-weight-transfer-mode and its bucket size, from the ranks' config (else disk)
        train = getattr(getattr(group, "config", None), "train", None)
        self.transfer_mode = getattr(train, "update_weight_transfer_mode", "disk")
        self.buffer_bytes = getattr(train, "update_weight_buffer_size", DEFAULT_BUFFER_BYTES)
        self.timeout_s = getattr(train, "update_weight_timeout", 300.0)  # each wait of a push
        self.run_dir = getattr(train, "run_dir", None)  # where the ranks record their collectives
        self.lock = threading.Lock()
        self._current: tuple[Path, int] | None = None
        # the last push's seconds per rank (export) and per engine (load), as journal keys
        self.last_times: dict[str, float] = {}

    def current(self) -> tuple[Path, int]:
        """The directory of the weights the engines should serve, and their version."""
        if self._current is None:
            raise WeightSyncError("no weights were synced yet")
        return self._current

    def serving(self, model_dir: Path, version: int) -> None:
        """The engines serve `model_dir` at `version` now (a fresh or resumed run)."""
        self._current = (Path(model_dir), int(version))
        if self.supervisor is not None:
            self.supervisor.attach_weights(self)

    def announce(self, version: int) -> None:
        """Tell the router (if rollouts go through one) the weight version now serving."""
        if self.router is not None:
            self.router.set_weight_version(version)

    def push(self, version: int, pause_mode: str | None = None) -> None:
        """Export the ranks' weights and load them into every engine as `version`; with `pause_mode`
        (async training) the engines are paused in that mode around the load."""
        tail = SpanTail(self._timeline())  # the engines write their spans of this push after it
        if self.supervisor is not None:
            with self.lock:
                self._push_supervised(version, pause_mode)
            self._engine_own_times(tail)
            return
        if self.transfer_mode == "broadcast" and not self.in_memory:
            self._push_broadcast(version, pause_mode)
        elif self.in_memory:
            states = self._export(None, version)
            weights = _engine_weights()
            seconds = {}
            with paused(self.engine_urls, pause_mode, self.admin_token, self.timeout_s):
                for url in self.engine_urls:
                    start = time.perf_counter()
                    weights.push_weights_in_memory(url, states[0], str(version), self.timeout_s,
                                                   token=self.admin_token)
                    seconds[url] = time.perf_counter() - start
            self._engine_times(seconds)
        else:
            target = self._export_to_disk(version)
            with paused(self.engine_urls, pause_mode, self.admin_token, self.timeout_s):
                failures, seconds = push_disk_each(self.engine_urls, target, version,
                                                   self.admin_token, self.timeout_s)
            self._engine_times(seconds)
            if failures:
                raise next(iter(failures.values()))
            self._keep_only(target)
        self._engine_own_times(tail)
        self._set_version(version)
        self.announce(version)

    def _push_broadcast(self, version: int, pause_mode: str | None) -> None:
        """The broadcast push to every engine; any engine that did not apply it fails the push."""
        self.last_times = {}
        failures = self._broadcast(self.engine_urls, version, pause_mode)
        if failures:
            raise WeightSyncError(f"the broadcast of weight version {version} failed: "
                                  f"{next(iter(failures.values()))}")

    def _broadcast(self, urls: list[str], version: int, pause_mode: str | None) -> dict[str, str]:
        """Every rank gathers what it sends (FSDP: rank 0 the whole model; Megatron: each pipeline
        stage's source rank its own stage, over its TP group), then every stage's source streams
        its part to the engines `urls` at once, each over its own group (weight_broadcast.py); an
        engine applies the push once every stage's last bucket is in. Only the transfer runs
        paused. The engines that do not serve `version` after it, with why; a training rank that
        died or stopped fails the push on the ranks (`_on_ranks`)."""
        _, seconds = self._on_ranks("stage_weights", version)
        self._add_rank_times(seconds)
        target = SendTarget(tuple(urls), self.admin_token, self.buffer_bytes,
                            timeout_s=self.timeout_s)
        start = time.perf_counter()
        with paused(urls, pause_mode, self.admin_token, self.timeout_s):
            reports, failed = self._send_on_ranks(target, version)
        if failed is not None:  # no engine is known to have applied the whole push
            return {url: failed for url in urls}
        stages = sorted(report for report in reports if report is not None)
        merged = merge_stats([stats for _, stats in stages], time.perf_counter() - start)
        self.last_times.update(merged.metrics())
        for stage, stats in stages:
            self.last_times.update(stats.stage_metrics(stage))
        self._engine_times({url: merged.seconds for url in urls})  # they receive together
        return {url: f"engine {url} did not apply weight version {version}: not every one of the "
                     f"{len(stages)} stages' groups delivered its part"
                for url in urls if url not in merged.applied}

    def _send_on_ranks(self, target: SendTarget, version: int) -> tuple[list, str | None]:
        """`send_weights` on every rank (each stage's source sends, the others answer at once):
        their answers, and why the send failed (None: it did not). A rank that died or stopped
        ends the ranks (WeightSyncError, as in `_on_ranks`); a failed send leaves them in step
        (no collective spans the ranks meanwhile)."""
        try:
            reports, _ = self.group.call_bounded(
                "send_weights", target, version, grace_s=self.timeout_s + 10.0,
                gone=lambda rank: gone(self.run_dir, rank, version), hung=self._hung(version))
        except RankCallError as exc:
            if exc.silent or any(e.startswith("its process died") for e in exc.errors.values()):
                self.group.kill()
                raise RanksFailedError(f"the weight push of version {version} failed on the "
                                      f"training ranks and they were ended (a relaunch starts "
                                      f"them from the last checkpoint): {exc}") from None
            return [], "; ".join(f"rank {rank}: {error}" for rank, error in exc.errors.items())
        return reports, None

    def _export_to_disk(self, version: int) -> Path:
        """Every rank exports `version`'s weights to their directory under export_root, which is returned."""
        target = self.export_root / f"v{version:06d}"
        self._export(str(target), version)
        return target

    def _keep_only(self, target: Path) -> None:
        """Remove every exported directory but `target` (the weights the engines serve now)."""
        for old in self.export_root.glob("v*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)

    def _set_version(self, version: int) -> None:
        """The ranks' weight version (their journal and checkpoints carry it) is `version` from now on."""
        self.group.call("set_weight_version", version)

    def _export(self, directory: str | None, version: int) -> list:
        """Every rank's export (rank 0 writes or returns the full state), timed per rank."""
        self.last_times = {}
        results, seconds = self._on_ranks("push_export", version, directory)
        self._add_rank_times(seconds)
        return results

    def _add_rank_times(self, seconds: list[float]) -> None:
        """Each rank's seconds in the push's collectives (a supervised broadcast has two)."""
        for rank, s in enumerate(seconds):
            key = f"perf/update_weights_rank_{rank}_time"
            self.last_times[key] = self.last_times.get(key, 0.0) + s

    def _on_ranks(self, method: str, version: int, *args) -> tuple[list, list[float]]:
        """A collective step of the push of `version` on every rank, bounded: the ranks fail their
        own waits at --update-weight-timeout; here the others get that long again once one failed,
        and a rank recorded dead or silent in the collective is not waited for. A failure ends the
        ranks (their groups are out of step) and is a WeightSyncError naming each rank's part."""
        try:
            return self.group.call_bounded(method, *args, version, grace_s=self.timeout_s + 10.0,
                                           gone=lambda rank: gone(self.run_dir, rank, version),
                                           hung=self._hung(version))
        except RankCallError as exc:
            self.group.kill()
            raise RanksFailedError(f"the weight push of version {version} failed on the training "
                                  f"ranks and they were ended (a relaunch starts them from the "
                                  f"last checkpoint): {exc}") from None

    def _hung(self, version: int):
        """A rank whose record of the push of `version` has been silent past the deadline (and a
        heartbeat's grace): stopped in its part, with no peer rank to fail it."""
        return lambda rank: gone(self.run_dir, rank, version, stale_s=self.timeout_s + STALE_S)

    def _engine_times(self, seconds: dict[str, float]) -> None:
        """Per engine, named by its index in the run's engine list (a URL is no metric name; a relaunched
        engine keeps its port, so its URL and index)."""
        for url, s in seconds.items():
            if url in self.engine_urls:
                self.last_times[f"perf/update_weights_engine_{self.engine_urls.index(url)}_time"] = s

    def _timeline(self) -> Path | None:
        return Path(self.run_dir) / layout.TIMELINE if self.run_dir is not None else None

    def _engine_own_times(self, tail: SpanTail) -> None:
        """The spread of the engines' own receive+apply seconds in this push, from their spans
        (`miles.run.engine_stragglers`); the sender's clock gives a broadcast's engines one time."""
        own = engine_own_seconds(tail.spans(), self.engine_urls)
        self.last_times.update(engine_time_metrics(own))

    def _push_supervised(self, version: int, pause_mode: str | None = None) -> None:
        """Push to the ready engines only; an engine that fails is marked stale for the supervisor, which
        brings it (and any engine that is relaunching) up to `version` from the kept directory (with
        broadcast too: the ranks write it as well, for the relaunched and the stale engines)."""
        target = self._export_to_disk(version)
        ready = self.supervisor.ready_urls()
        try:
            if self.transfer_mode == "broadcast" and not self.in_memory:
                failures = self._broadcast(ready, version, pause_mode) if ready else {}
            else:
                with paused(ready, pause_mode, self.admin_token, self.timeout_s):
                    failures, seconds = push_disk_each(ready, target, version, self.admin_token,
                                                       self.timeout_s)
                self._engine_times(seconds)
        except RanksFailedError:  # the ranks' failure is not the supervisor's to heal
            raise
        except WeightSyncError as exc:  # an engine refused the pause: the supervisor's to heal, like a failed push
            failures = {url: exc for url in ready}
        for url, exc in failures.items():
            self.supervisor.engine_failed(url, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        self._current = (target, version)
        self._keep_only(target)
        self._set_version(version)
        try:
            self.announce(version)
        except httpx.HTTPError as exc:  # the router is down: the supervisor tells its relaunch this version
            print(f"[engines] the router missed weight version {version} ({exc!r}); its relaunch gets it",
                  flush=True)


def served_version(engine_url: str, probe_ids: list[int]) -> str | None:
    """The weight version an engine serves now, read off a one-token generation."""
    payload = {"input_ids": probe_ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    response = control_client().post(f"{engine_url}/generate", json=payload, timeout=120)
    if response.status_code != 200:
        raise WeightSyncError(f"engine {engine_url} did not answer a probe: {response.status_code}")
    version = (response.json().get("meta_info") or {}).get("weight_version")
    return None if version is None else str(version)
