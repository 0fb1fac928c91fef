"""Collect a diagnosis of a run and pack it as one .tar.gz: VERDICT.txt and verdict.json on top, then the
stacks, `ray status`, the run's actors and tasks, the Ray timeline, the last lines of every log, the
redacted config, the tracker delivery state, the health verdicts and the phase timeline.

Every file is scrubbed before it is packed: the secret values of this process's environment, of the
run's config (when the caller has it), and of the run's own processes (secret-named variables of their
environment, values of secret-named flags in their command lines) are blanked.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles.config.fields import is_secret_name
from miles.config.health import HealthConfig
from miles.config.secrets import Scrubber, env_scrubber
from miles.diagnose import probes
from miles.diagnose.run_state import read_run_state, tail
from miles.diagnose.stacks import dump_stacks, process_state, run_processes
from miles.diagnose.verdict import Findings, compose, verdict_text
from miles.health import RED, read_health_log
from miles.health.open_phase import open_phases
from miles.profiling.pyspy import read_processes
from miles.profiling.run_services import read_services
from miles.record import layout

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


def collect(run_dir: Path, cfg: HealthConfig | None = None, scrubber: Scrubber | None = None,
            out: Path | None = None, now: float | None = None) -> Diagnosis:
    """Diagnose `run_dir` now and write the bundle (default RUN_DIR/diagnose/diagnose-<time>.tar.gz)."""
    run_dir = Path(run_dir)
    cfg = cfg or HealthConfig()
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    name = f"diagnose-{stamp}"
    out = Path(out) if out is not None else run_dir / layout.DIAGNOSE / f"{name}.tar.gz"
    staging = Path(tempfile.mkdtemp(prefix="miles-diagnose-"))
    root = staging / name
    try:
        verdict, pids = _gather(run_dir, root, cfg, now)
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


def _gather(run_dir: Path, root: Path, cfg: HealthConfig, now: float) -> tuple[dict[str, Any], list[int]]:
    notes: list[str] = []
    root.mkdir(parents=True)
    try:
        listed = read_processes(run_dir)
    except FileNotFoundError:
        listed = {}
        notes.append(f"no process list ({layout.PROFILER_PROCESSES}): no pids of the run to dump")
    except (ValueError, TypeError, AttributeError, OSError) as exc:
        listed = {}
        notes.append(f"no process list: {layout.PROFILER_PROCESSES} is not a name -> pid object ({str(exc)[:100]})")
    services = read_services(run_dir)
    ray = services.get("ray", {})
    trainer = listed.get("trainer")  # the run lives as long as its trainer (without one listed: any process)
    alive = _running(trainer) if trainer else any(_running(pid) for pid in listed.values())

    workers: dict[str, int] = {}
    if alive and _reachable(ray.get("gcs_address")):
        ray_dir = root / "ray"
        ray_dir.mkdir()
        (ray_dir / "status.txt").write_text(probes.ray_status(ray["gcs_address"]))
        state, ray_notes = probes.ray_facts(run_dir, ray["gcs_address"], ray.get("dashboard_url"), ray_dir)
        notes += ray_notes
        workers = probes.ray_worker_pids(state)
    elif alive:
        notes.append("the run's Ray cluster is not reachable (or not recorded): no ray status, actors, tasks, timeline")
    else:
        notes.append("no live process: Ray's state is gone with the run")

    processes = run_processes(run_dir, listed, workers)
    stacks = dump_stacks(processes, root / "stacks")
    if any("ptrace" in s.error or "not installed" in s.error for s in stacks):
        notes.append("py-spy could not attach to some processes (see stacks/*.txt): their stacks are missing, "
                     "everything else is here")

    engines = [probes.probe_engine(i, url) for i, url in enumerate(services.get("engine_urls", []))] if alive else []
    router = probes.probe_router(services.get("router_url")) if alive else {"error": "not probed (run dead)"}
    (root / "probes.json").write_text(json.dumps({"engines": [e.__dict__ for e in engines], "router": router},
                                                   indent=1, default=str))
    run = read_run_state(run_dir, alive)
    red = [v for v in read_health_log(run_dir) if v.severity == RED]
    phases = open_phases(run_dir, now)
    _copy_run_files(run_dir, root, run.logs, notes)
    findings = Findings(alive, phases, stacks, engines, router, run, red, notes)
    return compose(findings, cfg), list(processes.values())


def _copy_run_files(run_dir: Path, root: Path, logs: dict[str, list[str]], notes: list[str]) -> None:
    run = layout.RunLayout(run_dir)
    files = root / "run"
    for key in COPIED:
        path = getattr(run, key)
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 64 * 1024 * 1024:
            target = files / layout.ENTRIES[key].path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    journal = tail(run.journal, JOURNAL_TAIL)
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
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    os.replace(tmp, out)
