"""The one delivery program behind `miles replay-spool`: moves journal lines into each tracker,
single-threaded, reading the journal and the trainer's `trainer.json`, writing only
`delivery.json` (under the run dir's delivery lock).

`follow` is a run's delivery process: each line reaches every tracker within seconds of its
record; it finishes as the trainer's close asks and leaves when the trainer is gone. `replay`
delivers what a tracker missed after the run. Per tracker a cursor counts the journal lines it
holds; a failure is logged once per outage and retried every `retry_interval` seconds, the
lines waiting in the journal, so training never waits on a tracker.
"""
from __future__ import annotations

import logging
import os
import time
import traceback
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import yaml

from miles.config.secrets import Scrubber, env_scrubber
from miles.record import layout
from miles.record.journal import JOURNAL_NAME, JournalFollower, read_journal
from miles.record.samples import samples_path
from miles.config.mlflow_store import artifact_dir as mlflow_artifact_dir, default_store_uri, sqlite_path
from miles.tracking.sinks.base import SINK_CLASSES, Delivery, Sink, SinkSpec, build_sink, spec_problem
from miles.tracking.sinks.mlflow_reattach import delivered_run
from miles.tracking.state import (CONFIG_ARTIFACT, DELIVERY_LOCK_PATH, DELIVERY_PATH, TRAINER_PATH, DeliveryState,
                                  SinkState, StateError, TrainerFile, pending, recorded_lines, try_delivery_lock)

log = logging.getLogger("miles.tracking")
LINES_PER_DELIVERY = 50
HEALTH_PATH = layout.HEALTH
POLL_S = 2.0  # how often the journal and the trainer are checked while following
# Following, a delivery waits this long after the previous one, so frequent lines go out in one
# call per tracker: MLflow's SQL store spends ~4x less CPU per point in a batch of a few lines.
BATCH_S = 4.0
NICENESS = 10  # once the trackers are open: a small share of a busy CPU, never none (see `follow`)
LOCK_WAIT_S = 120.0  # for a previous delivery process of this run dir to leave


class DeliveryBusy(RuntimeError):
    pass


@dataclass
class Slot:
    """One tracker and where its delivery stands."""

    name: str
    sink: Sink
    state: SinkState
    opened: bool = False
    down_since: float | None = None
    next_try: float = 0.0


class DeliveryLoop:
    """Delivers one run directory's journal to its trackers; the caller holds the delivery lock."""

    def __init__(self, run_dir: Path, specs: dict[str, SinkSpec], scrubber: Scrubber, retry_interval: float,
                 session: str | None = None, write_roots: list[Path] | None = None):
        self.run_dir, self.scrubber, self.retry_interval, self.session = run_dir, scrubber, retry_interval, session
        self.trainer, self.state = TrainerFile.load(run_dir), DeliveryState.load(run_dir)
        self.journal = JournalFollower(run_dir / JOURNAL_NAME)
        params = read_params(run_dir / CONFIG_ARTIFACT)
        self.slots = [Slot(name, build_sink(spec, params), self.state.sinks.setdefault(name, SinkState(spec)))
                      for name, spec in specs.items()]
        for slot in self.slots:  # where a tracker's server may have it write files on this machine
            if write_roots is not None and hasattr(slot.sink, "write_roots"):
                slot.sink.write_roots = list(write_roots)
        self.live = LiveFlags(run_dir / HEALTH_PATH)  # flags of a hung rollout, alerted as they come

    def alert_live(self) -> None:
        """Each new live red flag of the health watch to every open tracker that alerts (wandb, MLflow)."""
        for verdict in self.live.new():
            for slot in self.slots:
                hook = getattr(slot.sink, "alert_live", None)
                if slot.opened and hook is not None:
                    try:
                        hook(verdict)
                    except Exception as exc:  # an alert is best effort: the flag is in health.jsonl
                        log.warning("tracking: %s live alert failed (%s)", slot.name,
                                    self.scrubber.scrub(str(exc))[:300])

    def trainer_state(self) -> str:
        """"closed" (its close is asked for), "gone" (dead, or another trainer took the run over),
        "open" (it read its checkpoint) or "starting"."""
        self.trainer = TrainerFile.read(self.trainer.path)
        owner = self.trainer.trainer or {}
        if (self.trainer.close or {}).get("session") == self.session:
            return "closed"
        if owner.get("session") != self.session or not self.trainer.trainer_alive():
            return "gone"
        return "open" if owner.get("open") else "starting"

    def follow(self) -> str:
        """Deliver lines as they are recorded until the trainer's close ("closed") or its end ("gone")."""
        next_delivery = 0.0
        while True:
            status = self.trainer_state()
            waiting = bool(self.pending()) or not all(s.opened for s in self.slots)
            if (waiting and time.monotonic() >= next_delivery) or status == "gone":
                self.catch_up_all()  # when gone: what it recorded last, before leaving
                next_delivery, waiting = time.monotonic() + BATCH_S, False
            if status != "open":
                return status
            self.alert_live()
            # A new line is seen within a poll; lines already waiting are woken for when their
            # batch is due. Wake-ups are what an idle follower costs (measured on a 2-core VM: a
            # 0.05 ms file read took 2.4 ms of CPU after a 0.5 s sleep), so at most one a poll.
            time.sleep(min(POLL_S, max(0.05, next_delivery - time.monotonic())) if waiting else POLL_S)

    def catch_up_all(self) -> None:
        for slot in self.slots:
            self.catch_up(slot)

    def catch_up(self, slot: Slot, force: bool = False) -> bool:
        if slot.down_since is not None and not force and time.monotonic() < slot.next_try:
            return False
        try:
            if not slot.opened:
                slot.sink.open()
                slot.opened = True
                slot.state.spec = slot.sink.spec()  # now with its run id
                slot.state.uploaded = False  # the run is open again until this process finishes it
                slot.state.session = self.session
                slot.state.cursor = slot.sink.durable_cursor(slot.state.cursor)
                self.state.save()
                log.info("tracking: %s open %s", slot.name, slot.state.spec.options)
            lines = self.journal.read()
            while slot.state.cursor < len(lines):
                start, end = slot.state.cursor, min(len(lines), slot.state.cursor + LINES_PER_DELIVERY)
                slot.sink.deliver(self._delivery(lines, start, end))
                slot.state.cursor = end
                self.state.save()
        except StateError:
            raise  # a refusal (a server's artifact location outside the run dir), not an outage to retry
        except Exception as exc:
            if slot.down_since is None:  # once per outage
                slot.down_since = time.monotonic()
                log.warning("tracking: %s failed (%s: %s); training goes on, its points stay spooled in the journal "
                            "and are delivered when it is back (or by `miles replay-spool RUN_DIR`)",
                            slot.name, type(exc).__name__, self.scrubber.scrub(str(exc))[:500])
                log.debug("%s", self.scrubber.scrub(traceback.format_exc()))
            slot.next_try = time.monotonic() + self.retry_interval
            return False
        if slot.down_since is not None:
            log.warning("tracking: %s is back after %.0fs; spooled points delivered",
                        slot.name, time.monotonic() - slot.down_since)
            slot.down_since = None
        return True

    def _delivery(self, lines: list, start: int, end: int) -> Delivery:
        """Lines start..end, with each rollout's sample table (when logged) on its first line."""
        tables = {i - start: samples_path(self.run_dir, lines[i].rollout_id) for i in range(start, end)
                  if i == 0 or lines[i - 1].rollout_id != lines[i].rollout_id}
        return Delivery(lines[start:end], {i: p for i, p in tables.items() if p.exists()}, first=start)

    def finish(self, final: bool, timeout: float) -> dict[str, int]:
        """Deliver the journal (retrying a failed tracker until `timeout`), upload the trainer's
        artifacts when `final`, finish every tracker run; returns what is still spooled per tracker.
        Not `final`: the run goes on in a later process (the next chunk), which reopens the same runs."""
        deadline = time.monotonic() + timeout
        files = self.artifact_files() if final else []
        for slot in self.slots:
            while not self.catch_up(slot, force=True) and time.monotonic() < deadline:
                time.sleep(min(self.retry_interval, max(0.0, deadline - time.monotonic())))
            if slot.down_since is None and slot.opened:
                try:
                    slot.sink.upload(files)
                    slot.sink.close()
                    slot.state.uploaded = final
                    self.state.save()
                except Exception as exc:
                    log.warning("tracking: %s could not finish its run (%s: %s); `miles replay-spool %s` does it",
                                slot.name, type(exc).__name__, self.scrubber.scrub(str(exc))[:500], self.run_dir)
        return self.pending()

    def pending(self) -> dict[str, int]:
        return pending(len(self.journal.read()), {s.name: s.state for s in self.slots})

    def artifact_files(self) -> list[Path]:
        """The trainer's artifacts that exist and lie inside the run dir (symlinks resolved): trainer.json
        is a file in the run dir, and whoever can write it must not get other files of this user uploaded."""
        root = self.run_dir.resolve()
        files, outside = [], []
        for name in self.trainer.artifacts:
            path = Path(name) if Path(name).is_absolute() else self.run_dir / name
            resolved = path.resolve()
            if not resolved.is_relative_to(root):
                outside.append(name)
            elif resolved.exists():
                files.append(path)
        if outside:  # one line: a run dir copied elsewhere by an older miles names each file by its old path
            log.warning("tracking: not uploading %d file(s) trainer.json names outside the run dir %s "
                        "(a copied run dir written by an older miles names its old paths): %s",
                        len(outside), root, ", ".join(outside[:4]) + (", ..." if len(outside) > 4 else ""))
        return files


class LiveFlags:
    """The live red flags in RUN_DIR/health.jsonl written since this follower began (a restarted delivery
    does not alert old ones again); the file is read only when it grew."""

    def __init__(self, path: Path):
        self.path = path
        self.size = self._size()
        self.seen = len(self._live()) if self.size else 0

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def _live(self) -> list:
        from miles.health.watch import read_health_log

        return [v for v in read_health_log(self.path.parent) if v.live]

    def new(self) -> list:
        size = self._size()
        if size == self.size:
            return []
        self.size = size
        live = self._live()
        fresh, self.seen = live[self.seen:], len(live)
        return fresh


def read_params(path: Path) -> dict:
    """The run's public config (a tracker's params), {} when there is none; StateError when unreadable."""
    if not path.exists():
        return {}
    try:
        params = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise StateError(f"cannot read {path}: {' '.join(str(exc).split())[:300]}") from None
    if params is not None and not isinstance(params, dict):
        raise StateError(f"{path} holds a YAML {type(params).__name__}, not a mapping of settings")
    odd = [k for k in params or {} if not isinstance(k, str)]
    if odd:  # the trackers take setting names as strings; a run writes nothing else
        raise StateError(f"{path}: the setting name {odd[0]!r:.80} is a YAML {type(odd[0]).__name__}, not a string")
    return params or {}


def acquire_lock(run_dir: Path, wait_s: float):
    """The run dir's delivery lock (the one writer of delivery.json), waiting up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while (lock := try_delivery_lock(run_dir)) is None:
        if time.monotonic() >= deadline:
            raise DeliveryBusy(f"{run_dir / DELIVERY_LOCK_PATH} is held: another delivery process of this run dir "
                               f"(the run's own, or a `miles replay-spool`) is still running")
        time.sleep(0.2)  # poll interval of the wait, bounded by the deadline
    return lock


# the options of a spec that name where its tracker writes on this machine
WRITE_OPTIONS = {"tensorboard": ("log_dir",), "wandb": ("directory",), "mlflow": ("artifact_dir", "tracking_uri")}


def local_store(uri: str) -> str | None:
    """The file or directory an MLflow tracking URI writes to on this machine; None for a server."""
    if uri.startswith("sqlite:///"):
        return uri[len("sqlite:///"):]  # sqlite:////abs/path is absolute, sqlite:///rel relative
    if uri.startswith("file:"):
        return urllib.parse.urlsplit(uri).path
    return None if "://" in uri or uri.startswith("sqlite:") else uri


def same_server(a: str, b: str) -> bool:
    """Two MLflow tracking URIs name the same server (a trailing slash and the scheme's and host's case
    aside)."""
    x, y = urllib.parse.urlsplit(a.strip()), urllib.parse.urlsplit(b.strip())
    return (x.scheme.lower(), x.netloc.lower(), x.path.rstrip("/"), x.query) == \
        (y.scheme.lower(), y.netloc.lower(), y.path.rstrip("/"), y.query)


def check_server(name: str, spec: SinkSpec, trusted: str | None, source: Path) -> None:
    """StateError unless a remote MLflow server a state file names is the one the user configured (the
    replay's --mlflow-tracking-uri, else MLFLOW_TRACKING_URI): MLflow sends the environment's credentials
    (MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN) to whatever server it talks to, and a state file is a file
    in the run dir that anyone who could write there may have edited."""
    uri = spec.options.get("tracking_uri") if spec.kind == "mlflow" else None
    if not isinstance(uri, str) or local_store(uri) is not None:
        return  # a local store: confined to the run dir by check_specs
    if trusted and same_server(uri, trusted):
        return
    shown = f"not the one you configured ({trusted})" if trusted else "and you configured none"
    raise StateError(f"{source}: tracker {name!r}: names the MLflow server {uri!r:.200}, {shown}; "
                     f"replay-spool talks (and sends MLflow credentials) only to the server you name: pass "
                     f"--mlflow-tracking-uri {uri:.200} (or set MLFLOW_TRACKING_URI) if it is the run's own")


def shared_store_paths(run_dir: Path) -> set[Path]:
    """What the default MLflow store of a run writes besides its run dir (miles.config.mlflow_store): the
    database and the artifact root beside it; exactly these, so a state file can name no other place there."""
    uri = default_store_uri(run_dir)
    return {sqlite_path(uri).resolve(), Path(mlflow_artifact_dir(uri, run_dir)).resolve()}


def check_specs(run_dir: Path, specs: dict[str, SinkSpec], todo: set[str], allowed: list[Path],
                source: dict[str, Path], trusted_server: str | None = None) -> None:
    """StateError in one line for a spec its sink cannot be built from, one of `todo` (the trackers
    about to be written) that would write outside the run dir and the `allowed` directories, or one
    that names a remote MLflow server other than `trusted_server`: the state files are files in the run
    dir, and whoever can edit them must not get files written elsewhere, or the user's credentials sent
    elsewhere, by the user who replays them. `source`: the state file each spec was read from."""
    roots = [Path(run_dir).resolve()] + [Path(a).resolve() for a in allowed]
    shared = shared_store_paths(Path(run_dir).resolve())
    for name, spec in specs.items():
        problem = spec_problem(spec)
        if problem is not None:
            raise StateError(f"{source[name]}: tracker {name!r}: {problem}")
        if name in todo:
            check_server(name, spec, trusted_server, source[name])
        for option in WRITE_OPTIONS[spec.kind] if name in todo else ():
            value = spec.options.get(option)
            where = local_store(value) if option == "tracking_uri" and value is not None else value
            if where is None:
                continue
            target = Path(where).resolve()  # as the sink opens it (a relative one: from here)
            if target not in shared and not any(target.is_relative_to(root) for root in roots):
                raise StateError(f"{source[name]}: tracker {name!r}: option {option} names {where!r:.200}, "
                                 f"outside the run dir; replay-spool writes only inside it (pass --allow-dir DIR "
                                 f"if the run was started with its {spec.kind} files in DIR)")


def replay(run_dir: Path, timeout: float, retry_interval: float = 1.0, scrubber: Scrubber | None = None,
           allowed: list[Path] | None = None, trusted_server: str | None = None) -> dict[str, int]:
    """Deliver every spooled line, upload the artifacts, finish the tracker runs; returns what is
    still undelivered per tracker (empty: all done). Trackers write only inside the run dir and the
    `allowed` directories, and talk only to the remote MLflow server `trusted_server` (StateError
    before anything is written or sent otherwise); an MLflow server's artifact location on this
    machine is held to the same directories when the run is opened."""
    with acquire_lock(run_dir, 0.0):
        sinks, lines = DeliveryState.load(run_dir).sinks, recorded_lines(run_dir)
        for name, sink in sinks.items():
            if sink.cursor > lines:  # lines recorded later would count as delivered and never be
                raise StateError(f"{run_dir / DELIVERY_PATH}: {name} is said to hold {sink.cursor} journal lines, "
                                 f"but the journal has {lines}; this state is not this journal's (restore it, or "
                                 f"remove {name}'s entry to deliver every line to a new {name} run)")
        # the delivery state's spec has the run id its tracker opened; one never opened, the trainer's
        specs = {**TrainerFile.load(run_dir).trackers, **{name: s.spec for name, s in sinks.items()}}
        specs = {name: spec for name, spec in specs.items() if spec.kind in SINK_CLASSES}
        todo = {name: spec for name, spec in specs.items()
                if name not in sinks or sinks[name].cursor < lines or not sinks[name].uploaded}
        check_specs(run_dir, specs, set(todo), allowed or [],
                    {name: run_dir / (DELIVERY_PATH if name in sinks else TRAINER_PATH) for name in specs},
                    trusted_server)
        todo.update(_reattached(run_dir, {n: s for n, s in todo.items() if n not in sinks}))
        # the default MLflow store beside the run dir (shared by the runs of its folder) keeps this run's
        # artifacts under its own artifact root: that root is the run's too
        roots = [Path(run_dir).resolve()] + [Path(a).resolve() for a in allowed or []] + \
            sorted(p for p in shared_store_paths(Path(run_dir).resolve()) if p.suffix != ".db")
        return DeliveryLoop(run_dir, todo, scrubber or env_scrubber(), retry_interval,
                            write_roots=roots).finish(True, timeout)


def _reattached(run_dir: Path, unknown: dict[str, SinkSpec]) -> dict[str, SinkSpec]:
    """MLflow trackers without a delivery state (delivery.json deleted, or a copy without it) whose lines an
    existing MLflow run already holds: their spec with that run's id, so no second run is made (DD1)."""
    out = {}
    for name, spec in unknown.items():
        if spec.kind != "mlflow" or spec.options.get("run_id") is not None:
            continue
        try:
            found = delivered_run(spec.options, read_journal(Path(run_dir) / JOURNAL_NAME))
        except Exception as exc:  # the server down, an odd store: a new run, as before
            log.info("tracking: %s: looking for the run its lines went to failed (%s)", name, type(exc).__name__)
            continue
        if found is not None:
            log.warning("tracking: %s: %s names no %s run, but run %s already holds this journal's lines "
                        "(found by its run name or run dir, and its first point): delivering to it, not to a "
                        "new run", name, DELIVERY_PATH, name, found)
            out[name] = SinkSpec(spec.kind, {**spec.options, "run_id": found})
    return out


def follow(run_dir: Path, session: str | None, scrubber: Scrubber, retry_interval: float) -> tuple[str, dict[str, int]]:
    """Deliver the run's journal live; at the trainer's close finish as it asks ("closed"); when
    the trainer is gone leave the tracker runs open for its resume ("gone")."""
    trusted = os.environ.get("MLFLOW_TRACKING_URI") or None  # the run's own server, set by its trainer
    with acquire_lock(run_dir, LOCK_WAIT_S):
        trainer = TrainerFile.load(run_dir)
        for name, spec in trainer.trackers.items():
            check_server(name, spec, trusted, run_dir / TRAINER_PATH)
        session = session or (trainer.trainer or {}).get("session")
        for spec in trainer.trackers.values():  # while the trainer reads its checkpoint:
            try:  # import the trackers, create the MLflow store
                build_sink(spec, {}).prepare()
            except Exception as exc:  # its open will fail and report it
                log.info("tracking: preparing %s failed: %s", spec.kind, scrubber.scrub(str(exc)))
        waiting = DeliveryLoop(run_dir, {}, scrubber, retry_interval, session)
        while (status := waiting.trainer_state()) == "starting":
            time.sleep(POLL_S)  # the poll interval, until the trainer opens the tracker
        if status == "gone" or not (waiting.trainer.trainer or {}).get("open"):
            return status, {}  # gone, or closed before it opened: nothing to open here
        for name, spec in waiting.trainer.trackers.items():  # as the trainer's `open` wrote them
            check_server(name, spec, trusted, run_dir / TRAINER_PATH)
        loop = DeliveryLoop(run_dir, waiting.trainer.trackers, scrubber, retry_interval, session)  # of its `open`
        loop.catch_up_all()  # opens every tracker, at the trainer's priority
        # Then nice 10: against one busy training thread per core the kernel still gives delivery
        # about a tenth of a core (SCHED_IDLE, used before, gave it none until training paused, so
        # points arrived at the end of the run); its work per line is milliseconds.
        os.nice(max(0, NICENESS - os.nice(0)))
        status = loop.follow()
        if status == "gone":
            return status, loop.pending()
        return status, loop.finish(loop.trainer.close["final"], loop.trainer.close["timeout"])
