"""py-spy dumps of a run's processes: periodically while training (`--py-spy-interval`) and once on
demand (`miles py-spy RUN`); the processes are listed in RUN_DIR/profiler/processes.json."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from miles.profiling.window import profiler_dir
from miles.record import layout
from miles.record.files import write_atomic
from miles.serving.process import pid_alive

log = logging.getLogger(__name__)
PROCESSES = Path(layout.PROFILER_PROCESSES).name
DUMP_TIMEOUT_S = 30.0
PTRACE_HINTS = ("Permission denied", "Operation not permitted", "ptrace")


class PySpyUnavailable(RuntimeError):
    """py-spy is missing or the kernel forbids ptrace; the message says which and what to do."""


def dump_dir(run_dir: Path) -> Path:
    return Path(run_dir) / layout.PY_SPY


def write_processes(run_dir: Path, processes: dict[str, int]) -> Path:
    """Record the run's live processes (name -> pid) for `miles py-spy RUN` and the periodic dumps."""
    return write_atomic(profiler_dir(run_dir) / PROCESSES, json.dumps(processes, indent=1))


def read_processes(run_dir: Path) -> dict[str, int]:
    path = profiler_dir(run_dir) / PROCESSES
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} the run directory of a started run?")
    return {name: int(pid) for name, pid in json.loads(path.read_text()).items()}


def py_spy() -> str:
    exe = shutil.which("py-spy") or str(Path(os.sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        exe = _installed_py_spy() or exe
    if not Path(exe).exists():
        raise PySpyUnavailable("py-spy is not installed (pip install py-spy)")
    return exe


def _installed_py_spy() -> str | None:
    """The binary the py-spy package installed (a venv layered on another's site-packages has no copy
    beside its own python)."""
    from importlib import metadata

    try:
        dist = metadata.distribution("py-spy")
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if Path(str(file)).name == "py-spy":
            return str(Path(dist.locate_file(file)).resolve())
    return None


def dump(pid: int, out: Path, native: bool = False, nonblocking: bool = False) -> Path:
    """`py-spy dump --pid PID` into `out` (`--native`: C/C++ frames too; `--nonblocking`: without pausing
    it, for a process that is stopped already); PySpyUnavailable when ptrace is not allowed."""
    command = [py_spy(), "dump", "--pid", str(pid)] + ["--native"] * native + ["--nonblocking"] * nonblocking
    result = subprocess.run(command, capture_output=True, text=True, timeout=DUMP_TIMEOUT_S)
    if result.returncode != 0:
        error = (result.stderr or result.stdout).strip()
        if any(hint in error for hint in PTRACE_HINTS):
            raise PySpyUnavailable(f"py-spy may not trace pid {pid} ({error.splitlines()[0]}): the kernel forbids "
                                   f"ptrace here; run as root, set kernel.yama.ptrace_scope=0, or add CAP_SYS_PTRACE")
        raise RuntimeError(f"{' '.join(command[1:])} failed: {error[:500]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(result.stdout)
    return out


def dump_all(run_dir: Path, processes: dict[str, int] | None = None) -> list[Path]:
    """One dump of every live listed process, into RUN_DIR/profiler/py-spy/<time>/<name>.txt."""
    processes = read_processes(run_dir) if processes is None else processes
    now = time.time()
    folder = dump_dir(run_dir) / f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}.{int(now * 1000) % 1000:03d}"
    written = []
    for name, pid in processes.items():
        if not pid_alive(pid):
            continue
        try:
            written.append(dump(pid, folder / f"{name}-{pid}.txt"))
        except PySpyUnavailable:
            raise
        except (RuntimeError, subprocess.TimeoutExpired) as exc:  # a process that ended meanwhile
            log.warning("py-spy: %s", exc)
    return written


class PeriodicDumps:
    """A daemon thread dumping the run's processes every `interval` seconds until `stop`. If py-spy
    cannot trace, it says so once and stops; training goes on."""

    def __init__(self, run_dir: Path, interval: float, processes):
        self.run_dir, self.interval, self.processes = Path(run_dir), interval, processes
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="py-spy-dumps", daemon=True)
        self.rounds = 0

    def start(self) -> "PeriodicDumps":
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                dump_all(self.run_dir, self.processes())
                self.rounds += 1
            except PySpyUnavailable as exc:
                print(f"[profiler] py-spy dumps stop: {exc}; training goes on", flush=True)
                return
            except Exception:  # a background loop: log it and keep dumping
                log.exception("py-spy dump round failed")

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=DUMP_TIMEOUT_S * 2)
