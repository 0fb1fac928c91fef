"""Collect a diagnosis of a run and pack it as one .tar.gz: VERDICT.txt and verdict.json on top, then the
stacks, `ray status`, the run's actors and tasks, the Ray timeline, the last lines of every log, the
redacted config, the tracker delivery state, the health verdicts and the phase timeline.

Every file is scrubbed before it is packed: the secret values of this process's environment, of the
run's config (when the caller has it), and of the run's own processes (secret-named variables of their
environment, values of secret-named flags in their command lines) are blanked.
"""
from __future__ import annotations

import json
import shutil
import socket
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles.config import ConfigError
from miles.config.fields import is_secret_name
from miles.config.health import HealthConfig
from miles.config.secrets import Scrubber, env_scrubber
from miles.diagnose import probes
from miles.diagnose.confine import MARKERS, confined_view, escaping, inside, is_run, not_regular
from miles.diagnose.local_services import gcs_problem, local_url_problem
from miles.diagnose.lock_holders import lock_holder
from miles.diagnose.ray_view import RayView, ray_auth_env
from miles.diagnose.run_state import read_run_state, tail
from miles.diagnose.push_waits import push_wait_lines
from miles.diagnose.slowest_rank import read_slowest_rank
from miles.diagnose.stacks import dump_stacks, process_state, run_processes
from miles.diagnose.verdict import Findings, compose, verdict_text
from miles.health import RED, read_health_log
from miles.health.open_phase import open_phases, plausible
from miles.profiling.pyspy import read_processes
from miles.profiling.run_services import read_services
from miles.record import layout
from miles.record.timeline import open_spans
from miles.record.files import replacing

COPIED = ("timeline", "timeline_open", "health", "tracking_config", "trainer_state", "delivery_state",
          "profiler_processes", "services", "profiler_summaries")  # small files of the run, copied whole
JOURNAL_TAIL = 50


@dataclass
class Diagnosis:
    path: Path  # the bundle
    verdict: dict[str, Any]

    @property
    def text(self) -> str:
        return verdict_text(self.verdict)


def process_secrets(pids: list[int]) -> set[str]:
    """Secret values the run's processes hold: secret-named environment variables, and the value after a
    secret-named flag on their command line (`--wandb-key K`, `--router-admin-token=T`)."""
    found: set[str] = set()
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            name, _, value = item.decode(errors="replace").partition("=")
            if value and is_secret_name(name):
                found.add(value)
        words = [a.decode(errors="replace") for a in argv]
        for i, word in enumerate(words):
            if word.startswith("--") and is_secret_name(word[2:].split("=", 1)[0]):
                value = word.split("=", 1)[1] if "=" in word else (words[i + 1] if i + 1 < len(words) else "")
                if value:
                    found.add(value)
    return found


def _running(pid: int) -> bool:
    return process_state(pid) not in ("", "Z", "X")


def _reachable(address: str | None) -> bool:
    host, _, port = (address or "").rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
        return True
    except OSError:
        return False


def check_run_dir(run_dir: Path) -> None:
    """ConfigError unless `run_dir` is a run's folder: diagnose writes its bundle there."""
    if not is_run(run_dir):
        names = ", ".join(layout.ENTRIES[k].path for k in MARKERS)
        raise ConfigError("RUN_DIR", f"{run_dir} is not a run directory (it holds none of {names}); "
                                     f"nothing written there")


def bundle_path(run_dir: Path, name: str, out: Path | None) -> Path:
    """Where the bundle goes: `out` (a file path in an existing folder), else RUN_DIR/diagnose/NAME.tar.gz,
    that folder the run's own (not a link elsewhere)."""
    if out is not None:
        out = Path(out)
        if out.is_dir():
            raise ConfigError("--out", f"{out} is a directory; give the bundle's file path (e.g. {out / name}.tar.gz)")
        if not out.parent.is_dir():
            raise ConfigError("--out", f"the folder {out.parent} does not exist; create it or choose another path")
        return out
    folder = Path(run_dir) / layout.DIAGNOSE
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise ConfigError("RUN_DIR", f"{folder} is a link or not a folder: diagnose writes only into the run's own "
                                     f"{layout.DIAGNOSE}/ folder; remove it or pass --out PATH")
    folder.mkdir(exist_ok=True)
    return folder / f"{name}.tar.gz"


def collect(run_dir: Path, cfg: HealthConfig | None = None, scrubber: Scrubber | None = None,
            out: Path | None = None, now: float | None = None) -> Diagnosis:
    """Diagnose `run_dir` now and write the bundle (default RUN_DIR/diagnose/diagnose-<time>.tar.gz).
    ConfigError for a folder that is not a run, or a bundle path that cannot be one (nothing written)."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    cfg = cfg or HealthConfig()
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    name = f"diagnose-{stamp}"
    out = bundle_path(run_dir, name, out)
    staging = Path(tempfile.mkdtemp(prefix="miles-diagnose-"))
    root = staging / name
    try:
        verdict, pids = _gather(run_dir, root, cfg, now, staging)
        secrets = set(env_scrubber().secrets) | set(scrubber.secrets if scrubber else ()) | process_secrets(pids)
        scrub = Scrubber(tuple(sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True)))
        verdict = scrub.scrub_value(verdict)
        (root / "verdict.json").write_text(json.dumps(verdict, indent=1, default=str))
        (root / "VERDICT.txt").write_text(verdict_text(verdict))
        _scrub_tree(root, scrub)
        _pack(root, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Diagnosis(out, verdict)


def _readable_view(run_dir: Path, staging: Path, notes: list[str]) -> Path:
    """The run dir as diagnose reads it: files that resolve outside it, or are not regular files,
    are neither read nor packed (the readers get a confined copy of the rest), each named in a note."""
    escaped = escaping(run_dir)
    notes += [f"left out RUN_DIR/{rel}: it resolves outside the run dir (a link out of it); diagnose reads and "
              f"packs only the run's own files" for rel in escaped]
    odd = [rel for rel in not_regular(run_dir) if rel not in escaped]
    notes += [f"left out RUN_DIR/{rel}: not a regular file (a FIFO, socket, device or folder); diagnose reads "
              f"only regular files" for rel in odd]
    return confined_view(run_dir, staging / "view", escaped + odd) if escaped or odd else run_dir


def _listed_processes(view: Path, notes: list[str]) -> dict[str, int]:
    """The run's process list (name -> pid); empty, with a note, when it is missing or not one."""
    try:
        return read_processes(view)
    except FileNotFoundError:
        notes.append(f"no process list ({layout.PROFILER_PROCESSES}): no pids of the run to dump")
    except (ValueError, TypeError, AttributeError, OSError) as exc:
        notes.append(f"no process list: {layout.PROFILER_PROCESSES} is not a name -> pid object ({str(exc)[:100]})")
    return {}


def _open_phases(view: Path, now: float, notes: list[str]):
    """The phases open now; starts in the future or over a year old are skipped, with a note."""
    odd_starts = sum(not plausible(s, now) for s in open_spans(view))
    if odd_starts:
        notes.append(f"skipped {odd_starts} phase start(s) in {layout.TIMELINE_OPEN} in the future or more than a "
                     f"year ago: no phase of a live run")
    return open_phases(view, now)


def _gather(run_dir: Path, root: Path, cfg: HealthConfig, now: float,
            staging: Path) -> tuple[dict[str, Any], list[int]]:
    notes: list[str] = []
    root.mkdir(parents=True)
    view = _readable_view(run_dir, staging, notes)
    listed = _listed_processes(view, notes)
    services = read_services(view)
    ray = services.get("ray", {})
    trainer = listed.get("trainer")  # the run lives as long as its trainer (without one listed: any process)
    alive = _running(trainer) if trainer else any(_running(pid) for pid in listed.values())
    # a starting trainer holds .lock before it lists its processes (N22: "dead" 8 s into a run)
    holder = lock_holder(run_dir / layout.LOCK)
    if not alive and holder is not None and _running(holder):
        alive = True
        listed = {"trainer": holder, **listed}
        notes.append(f"the trainer (pid {holder}) holds {layout.LOCK} and has not listed its "
                     f"processes yet ({layout.PROFILER_PROCESSES}): starting")
    run_pids = [pid for pid in listed.values() if _running(pid)]

    # Ray first, in children bounded by one deadline, while the stacks and probes (which need no Ray) run
    ray_view = _start_ray_view(ray, run_dir, root / "ray", run_pids, notes) if alive else None
    if not alive:
        notes.append("no live process: Ray's state is gone with the run")

    processes = run_processes(run_dir, listed, {})
    stacks = dump_stacks(processes, root / "stacks")
    engines = [probes.probe_engine(i, url) for i, url in enumerate(services.get("engine_urls", []))] if alive else []
    router = probes.probe_router(services.get("router_url"), run_pids) if alive else {"error": "not probed (run dead)"}
    if ray_view is not None:
        state, ray_notes = ray_view.finish()
        notes += ray_notes
        known = set(processes.values())
        workers = {name: pid for name, pid in probes.ray_worker_pids(state).items() if pid not in known}
        stacks += dump_stacks(workers, root / "stacks")
        processes.update(workers)
    if any("ptrace" in s.error or "not installed" in s.error for s in stacks):
        notes.append("py-spy could not attach to some processes (see stacks/*.txt): their stacks are missing, "
                     "everything else is here")

    (root / "probes.json").write_text(json.dumps({"engines": [e.__dict__ for e in engines], "router": router},
                                                   indent=1, default=str))
    run = read_run_state(view, alive, logs_from=run_dir)
    run.delivery_pid = lock_holder(run_dir / layout.DELIVERY_LOCK)  # catching up on its own (N27)
    red = [v for v in read_health_log(view) if v.severity == RED]
    phases = _open_phases(view, now, notes)
    _copy_run_files(view, root, run.logs, notes)
    findings = Findings(alive, phases, stacks, engines, router, run, red, notes,
                        ranks=read_slowest_rank(view, cfg) + push_wait_lines(view, now))
    return compose(findings, cfg), list(processes.values())


def _start_ray_view(ray: dict[str, str], run_dir: Path, out: Path, run_pids: list[int],
                    notes: list[str]) -> RayView | None:
    """The Ray part of a live run, started (None, with a note, when the cluster is not to be asked)."""
    gcs = ray.get("gcs_address")
    if not gcs:
        notes.append("the run's Ray cluster is not recorded (profiler/services.json): no ray status, actors, tasks, "
                     "timeline")
        return None
    problem = gcs_problem(gcs)
    if problem is not None:
        notes.append(f"Ray state skipped: {problem}")
        return None
    if not _reachable(gcs):
        notes.append(f"the run's Ray cluster at {gcs} is not reachable: no ray status, actors, tasks, timeline")
        return None
    dashboard = ray.get("dashboard_url")
    if dashboard and local_url_problem(dashboard) is not None:
        dashboard = None  # the GCS gives the same state; Ray's token goes to no other machine
    env, token_words = ray_auth_env(run_pids)
    return RayView(gcs, dashboard, out, run_dir, env, token_words)


def _copy_run_files(run_dir: Path, root: Path, logs: dict[str, list[str]], notes: list[str]) -> None:
    run = layout.RunLayout(run_dir)
    files = root / "run"
    for key in COPIED:
        path = getattr(run, key)
        if path.is_file() and not path.is_symlink() and inside(run_dir, path) and \
                path.stat().st_size < 64 * 1024 * 1024:
            target = files / layout.ENTRIES[key].path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    journal = tail(run.journal, JOURNAL_TAIL) if inside(run_dir, run.journal) else []
    if journal:
        (files / layout.JOURNAL).parent.mkdir(parents=True, exist_ok=True)
        (files / layout.JOURNAL).write_text("\n".join(journal) + "\n")
    for rel, lines in logs.items():
        target = root / "logs" / (rel.replace("/", "__") + ".tail")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(lines) + "\n")
    try:
        from miles.health.history import from_run_dir
        from miles.health.verdicts import format_table, summarize

        history = from_run_dir(run_dir)
        (root / "health.txt").write_text(format_table(history, summarize(history)) + "\n")
    except Exception as exc:  # no journal yet, or an unreadable one: the rest of the bundle still counts
        notes.append(f"no health table: {str(exc)[:200]}")


def _scrub_tree(root: Path, scrub: Scrubber) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            text = data.decode("utf-8", errors="surrogateescape")
            cleaned = scrub.scrub(text)
            if cleaned != text:
                path.write_bytes(cleaned.encode("utf-8", errors="surrogateescape"))


def _pack(root: Path, out: Path) -> None:
    """The bundle through a temporary file of its own in the target folder (created exclusively, removed on
    failure), then renamed into place; readable by its owner only, as mkstemp makes it."""
    with replacing(out, mode=0o600) as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        tar.add(root, arcname=root.name)
