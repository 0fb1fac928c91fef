"""Engine supervision in the trainer's process: notice a dead or hung engine, relaunch it on its port, and
readmit it to the router only once it serves the current weights.

A background thread checks every engine each `--engine-health-interval`: a process that exited is dead; a
live one whose `/health` fails `--engine-hung-checks` times in a row (e.g. SIGSTOP'd) is hung and is
killed. Either way the router is told at once to mark the worker stale (no more traffic), and the engine is
relaunched on the same port (so its URL, the router's worker key, stays the same) after a backoff that
doubles per restart, within `--engine-max-restarts`. The new process is pushed the weights the trainer
last synced (a directory the weight sync keeps) and only then admitted at that version. The weight sync
and the readmission share one lock, so an engine is never admitted at a version the trainer has already
moved past.

The router is watched the same way when the supervisor is given it (`router_process`, `relaunch_router`):
relaunched on its port, it is told the current weight version and every engine is registered again at
its state (ready engines as healthy, the others stale), so traffic resumes where it was.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import httpx

from miles.engines.weights import push_weights_from_disk
from miles.record.timeline import TimelineWriter
from miles.serving.router_client import RouterClient
from miles.serving.control_http import control_client

MAX_BACKOFF_S = 30.0
ROUTER_TIMEOUT_S = 10.0  # an admin call from the watch thread: a hung router must not hold the engine checks long
LANE = "engines"
READY, DOWN, RELAUNCHING, STALE, FAILED = "ready", "down", "relaunching", "stale", "failed"


class Supervised(Protocol):
    """A service the supervisor can watch: a local process (`ServiceProcess`, a plain run) or one a Ray
    actor owns (`miles.cluster.service_actors.ActorService`, the Prefect flow)."""

    url: str
    pid: int
    port: int

    def exit_code(self) -> int | None: ...
    def kill(self) -> None: ...


class WeightSource(Protocol):
    """What the supervisor needs of the trainer's weight sync: its lock and the weights engines serve now."""

    lock: threading.Lock

    def current(self) -> tuple[Path, int]: ...


@dataclass(frozen=True)
class SupervisionPolicy:
    interval: float = 1.0       # seconds between checks of each engine
    timeout: float = 2.0        # seconds a /health may take
    hung_checks: int = 3        # failed checks in a row of a live process before it is killed
    max_restarts: int = 3       # relaunches per engine before it is left down
    backoff: float = 1.0        # seconds before the first relaunch; doubles per restart

    @classmethod
    def from_config(cls, o) -> "SupervisionPolicy":
        return cls(o.engine_health_interval, o.engine_health_timeout, o.engine_hung_checks, o.engine_max_restarts,
                   o.engine_restart_backoff)

    def delay(self, restart: int) -> float:
        """Seconds to wait before relaunch number `restart` (1-based)."""
        return min(self.backoff * 2 ** (restart - 1), MAX_BACKOFF_S)


@dataclass
class EngineSlot:
    """One supervised engine: its current process, state and history."""

    index: int
    service: Supervised
    state: str = READY
    restarts: int = 0
    failed_checks: int = 0
    weight_version: int | None = None
    down_since: float | None = None  # time.time() of the death, until readmission

    @property
    def url(self) -> str:
        return self.service.url


@dataclass
class SupervisorCounters:
    """Figures since the previous `take` (the trainer reads them once per iteration)."""

    restarts: int = 0  # relaunches begun
    router_restarts: int = 0
    readmissions: int = 0
    deaths: int = 0
    seconds_to_readmit: list[float] = field(default_factory=list)


class EngineSupervisor:
    """Owns the engines' liveness: `start()` the watch thread, `ready_urls()` for the weight sync,
    `take()` the counters, `stop()` at the end. `relaunch(index, port)` starts a new engine process."""

    def __init__(self, engines: list[Supervised], relaunch: Callable[[int, int], Supervised],
                 policy: SupervisionPolicy, router: RouterClient | None = None,
                 timeline: TimelineWriter | None = None, log: Callable[[str], None] | None = None,
                 router_process: Supervised | None = None,
                 relaunch_router: Callable[[int], Supervised] | None = None,
                 engine_token: str | None = None, on_event: Callable[[str, dict], None] | None = None):
        self.engine_token = engine_token  # the run's token: a relaunched engine's weight push carries it
        self.slots = [EngineSlot(i, e) for i, e in enumerate(engines)]
        self.relaunch_fn, self.policy, self.router = relaunch, policy, router
        self.router_process, self.relaunch_router = router_process, relaunch_router
        self.router_restarts = 0
        self.router_failed = False  # the router used its restarts and is left down
        self.router_down = threading.Event()  # set while the router is being relaunched
        self.timeline = timeline or TimelineWriter(None)
        self.on_event = on_event  # each state change (the flow emits a Prefect event per call)
        self.log = log or (lambda line: print(line, flush=True))
        self.weights: WeightSource | None = None
        self.counters = SupervisorCounters()
        self._lock = threading.Lock()  # guards slot states and counters
        self._stop = threading.Event()     # the watch loop ends
        self._abandon = threading.Event()  # a relaunch or readmission under way gives up
        self._thread: threading.Thread | None = None
        self._healers: list[threading.Thread] = []
        self._client = httpx.Client(timeout=policy.timeout)  # used by the watch thread only

    # ---- wiring ------------------------------------------------------------------------------
    def attach_weights(self, weights: WeightSource) -> None:
        """The weight sync that knows the current weights (set once the trainer has one)."""
        self.weights = weights

    def start(self) -> "EngineSupervisor":
        self._thread = threading.Thread(target=self._watch, name="miles-engine-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, finish_healing: bool = False) -> None:
        """Stop watching (idempotent). With `finish_healing`, a relaunch or readmission under way is
        completed first (the run ends with every engine it could bring back at the current weights);
        else it is abandoned at its next wait."""
        self._stop.set()
        if not finish_healing:
            self._abandon.set()
        if self._thread is not None:
            self._thread.join(timeout=self.policy.interval + self.policy.timeout + 5)
        for healer in self._healers:  # a relaunch under way finishes, so its process is the caller's to stop
            healer.join(timeout=240.0)

    # ---- what the trainer reads ----------------------------------------------------------------
    def ready_urls(self) -> list[str]:
        with self._lock:
            return [s.url for s in self.slots if s.state == READY]

    def states(self) -> dict[str, int]:
        with self._lock:
            out = {state: 0 for state in (READY, DOWN, RELAUNCHING, STALE, FAILED)}
            for slot in self.slots:
                out[slot.state] += 1
            return out

    def served_versions(self) -> list[str | None]:
        """The weight version each engine reports serving now (None: it is down or does not answer)."""
        out = []
        for slot in self.slots:
            try:
                response = control_client().get(slot.url + "/get_weight_version", timeout=self.policy.timeout + 5)
                out.append(str(response.json()["weight_version"]) if response.status_code == 200 else None)
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                out.append(None)
        return out

    def gave_up(self) -> str | None:
        """Why no request can be served again, or None while an engine serves or can come back: every engine
        used its --engine-max-restarts and is left down, or the router did."""
        limit = f"its {self.policy.max_restarts} restarts (--engine-max-restarts)"
        if self.router_failed:
            return f"the router used {limit} and is down"
        with self._lock:
            failed = [s.index for s in self.slots if s.state == FAILED]
        if not self.slots or len(failed) < len(self.slots):
            return None
        if len(failed) == 1:
            return f"engine {failed[0]} used {limit} and is down"
        return f"every engine ({', '.join(map(str, failed))}) used {limit} and is down"

    def take(self) -> SupervisorCounters:
        with self._lock:
            taken, self.counters = self.counters, SupervisorCounters()
            return taken

    def engine_failed(self, url: str, reason: str) -> None:
        """The weight sync could not reach `url`: take it out of traffic now; the watch decides the rest."""
        with self._lock:
            slot = next((s for s in self.slots if s.url == url), None)
            if slot is None or slot.state != READY:
                return
            slot.state = STALE
        self.log(f"[engines] engine {slot.index} missed a weight update ({reason}); marked stale")
        now = time.time()
        self._changed("engine_stale", now, now, engine=slot.index, reason=reason)
        self._tell_router(slot, stale=True)

    # ---- the watch -----------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.policy.interval):
            try:
                self._check_router()
            except Exception as exc:  # the watch must outlive any one bad check
                self.log(f"[engines] supervisor check of the router failed: {exc!r}")
            for slot in self.slots:
                try:
                    self._check(slot)
                except Exception as exc:  # the watch must outlive any one bad check
                    self.log(f"[engines] supervisor check of engine {slot.index} failed: {exc!r}")

    def _check(self, slot: EngineSlot) -> None:
        with self._lock:
            state = slot.state
        if state in (RELAUNCHING, FAILED):
            return
        code = slot.service.exit_code()
        if code is not None:
            self._down(slot, f"died (exit {code})")
            return
        if state == STALE:  # alive but behind (a missed push): bring it up to date without a restart
            self._spawn(self._readmit, slot, time.time())
            return
        if self._healthy(slot):
            slot.failed_checks = 0
            return
        slot.failed_checks += 1
        if slot.failed_checks >= self.policy.hung_checks:
            slot.service.kill()  # a SIGSTOP'd process dies of SIGKILL too
            self._down(slot, f"hung (/health failed {slot.failed_checks} times in a row): killed")

    def _check_router(self) -> None:
        """Relaunch a dead router on its port (here, in the watch: engines cannot be readmitted without it),
        then register every engine again at its state."""
        process = self.router_process
        if process is None or self.relaunch_router is None:
            return
        code = process.exit_code()
        if code is None:
            return
        since = time.time()
        self.router_down.set()
        self.log(f"[engines] router died (exit {code})")
        self._changed("router_down", since, since, reason=f"exit {code}")
        if self.router_restarts >= self.policy.max_restarts:
            self.router_process, self.router_failed = None, True
            self.log(f"[engines] router used its {self.policy.max_restarts} restarts (--engine-max-restarts); "
                     f"left down")
            self._changed("router_failed", since, time.time(), restarts=self.router_restarts)
            return
        self.router_restarts += 1
        with self._lock:
            self.counters.router_restarts += 1
        if self._abandon.wait(self.policy.delay(self.router_restarts)):
            return
        self.router_process = self.relaunch_router(process.port)
        self._register_all()
        self.router_down.clear()
        self.log(f"[engines] router relaunched in {time.time() - since:.1f} s (pid {self.router_process.pid}), "
                 f"{len(self.slots)} engines registered again")
        self._changed("router_restart", since, time.time(), restart=self.router_restarts)

    def _register_all(self) -> None:
        """The current weight version, then each engine at its state; under the weights lock so a push
        cannot move the version in between."""
        lock = self.weights.lock if self.weights is not None else threading.Lock()
        with lock:
            version = self.weights.current()[1] if self.weights is not None else None
            if version is not None:
                self.router.set_weight_version(version)
            with self._lock:
                states = [(slot.url, slot.state == READY) for slot in self.slots]
            for url, ready in states:
                self.router.add_worker(url, ready, version if ready else None)

    def _changed(self, name: str, start: float, end: float, **fields) -> None:
        """One state change: a span in the run's timeline (the dashboard's engines lane) and, when the
        caller listens (the flow's Prefect events), a call with its name and fields."""
        self.timeline.add(name, start, end, lane=LANE, **fields)
        if self.on_event is not None:
            try:
                self.on_event(name, {**fields, "seconds": round(end - start, 3)})
            except Exception as exc:  # a listener must not stop the healing
                self.log(f"[engines] the {name} event was not sent: {exc!r}")

    def _healthy(self, slot: EngineSlot) -> bool:
        try:
            return self._client.get(slot.url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def _answers(self, slot: EngineSlot) -> bool:
        """One /health from a healer thread (the watch's client is the watch thread's own)."""
        try:
            return control_client().get(slot.url + "/health", timeout=self.policy.timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def _down(self, slot: EngineSlot, why: str) -> None:
        now = time.time()
        with self._lock:
            slot.state, slot.failed_checks, slot.down_since = DOWN, 0, now
            self.counters.deaths += 1
        self.log(f"[engines] engine {slot.index} {why}")
        self._changed("engine_down", now, now, engine=slot.index, reason=why)
        self._tell_router(slot, stale=True)
        if slot.restarts >= self.policy.max_restarts:
            with self._lock:
                slot.state = FAILED
            self.log(f"[engines] engine {slot.index} used its {self.policy.max_restarts} restarts "
                     f"(--engine-max-restarts); left down")
            self._changed("engine_failed", now, time.time(), engine=slot.index, restarts=slot.restarts)
            return
        with self._lock:
            slot.state = RELAUNCHING
            self.counters.restarts += 1  # counted when decided, so the iteration it happened in shows it
        self._spawn(self._relaunch, slot, now)

    def _spawn(self, target, slot: EngineSlot, since: float) -> None:
        if slot.state == STALE:
            with self._lock:
                slot.state = RELAUNCHING  # one readmission at a time per engine
        healer = threading.Thread(target=target, args=(slot, since), name=f"miles-engine-{slot.index}-heal",
                                  daemon=True)
        self._healers = [h for h in self._healers if h.is_alive()] + [healer]
        healer.start()

    def _relaunch(self, slot: EngineSlot, since: float) -> None:
        restart = slot.restarts + 1
        if self._abandon.wait(self.policy.delay(restart)):
            return
        started = time.time()
        try:
            service = self.relaunch_fn(slot.index, slot.service.port)
        except Exception as exc:
            slot.restarts = restart
            self.log(f"[engines] engine {slot.index} relaunch {restart} failed: {str(exc).splitlines()[0]}")
            with self._lock:
                slot.state = DOWN
            self._down(slot, "could not be relaunched")
            return
        with self._lock:
            slot.service, slot.restarts = service, restart
        self.log(f"[engines] engine {slot.index} relaunched in {time.time() - since:.1f} s "
                 f"(pid {service.pid}, restart {restart}/{self.policy.max_restarts})")
        self._changed("engine_relaunch", started, time.time(), engine=slot.index, restart=restart)
        self._readmit(slot, since)

    def _readmit(self, slot: EngineSlot, since: float) -> None:
        """Push the current weights to the engine, then admit it at that version; the weight sync waits on
        the same lock, so the version cannot move between the push and the admission."""
        while not self._abandon.is_set():
            if self.weights is None:  # the trainer has no weights yet: the engine serves the base model
                if self._abandon.wait(self.policy.interval):
                    return
                continue
            try:
                with self.weights.lock:
                    model_dir, version = self.weights.current()
                    push_weights_from_disk(slot.url, model_dir, str(version), timeout=120.0, token=self.engine_token)
                    self._tell_router(slot, stale=False, version=version, strict=True)
                    with self._lock:
                        slot.state, slot.weight_version = READY, version
                        self.counters.readmissions += 1
                        self.counters.seconds_to_readmit.append(time.time() - since)
                        slot.down_since = None
            except Exception as exc:
                if slot.service.exit_code() is None and not self._answers(slot):
                    slot.service.kill()  # hung while being brought up to date
                if slot.service.exit_code() is not None:  # it died: the watch relaunches it
                    with self._lock:
                        slot.state = STALE
                    return
                self.log(f"[engines] engine {slot.index} readmission failed, retrying: {str(exc).splitlines()[0]}")
                if self._abandon.wait(self.policy.interval):
                    return
                continue
            self.log(f"[engines] engine {slot.index} readmitted at weight version {version} "
                     f"({time.time() - since:.1f} s after it went down)")
            self._changed("engine_restart", since, time.time(), engine=slot.index,
                              weight_version=version)
            return

    def _tell_router(self, slot: EngineSlot, stale: bool, version: int | None = None, strict: bool = False) -> None:
        if self.router is None:
            return
        try:
            if stale:
                self.router.mark_stale(slot.url)
            else:
                self.router.admit(slot.url, version)
        except Exception as exc:  # marking stale is best effort (the router's own checks quarantine it too)
            if strict:
                raise
            self.log(f"[engines] could not tell the router about engine {slot.index}: {exc}")
