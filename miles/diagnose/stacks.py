"""The stacks of a run's processes: which processes belong to the run, a py-spy dump of each (native
frames where py-spy can), the process state from /proc, and the frames a verdict quotes."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from miles.profiling import pyspy

THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \((\w+)\)(?:: "([^"]*)")?')  # --native dumps name no thread
PYTHON_FRAME = re.compile(r"(\.py|>):\d+\)$")  # a Python frame names its line; a native one its library
FRAME = re.compile(r"^\s+(\S.*?) \((.*)\)$")
# frames that only say "waiting": a verdict quotes the innermost frame outside them
PLUMBING = ("/threading.py", "/selectors.py", "/socket.py", "/ssl.py", "/queue.py", "/subprocess.py",
            "/concurrent/futures/", "/asyncio/", "/site-packages/ray/", "/site-packages/httpx/",
            "/site-packages/httpcore/", "/site-packages/anyio/", "/site-packages/uvicorn/", "<frozen ")
STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "T": "stopped (SIGSTOP)",
          "t": "stopped by a tracer", "Z": "a zombie", "X": "dead", "I": "idle"}


@dataclass
class ProcessStack:
    name: str
    pid: int
    state: str = ""  # /proc/PID/stat's state letter; "" when gone
    dump: str = ""  # py-spy's text
    error: str = ""  # why there is no dump
    threads: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (name, idle/active, frames innermost first)

    @property
    def alive(self) -> bool:
        return self.state not in ("", "Z", "X")

    @property
    def state_words(self) -> str:
        return STATES.get(self.state, self.state) if self.state else "gone"

    def main_frames(self) -> list[str]:
        for name, _, frames in self.threads:
            if name == "MainThread":
                return frames
        return self.threads[0][2] if self.threads else []

    def where(self) -> str:
        """The innermost frame of the main thread that is the program's own Python (not waiting plumbing,
        not a native frame), and the innermost frame it waits in: "reward (sleepy.py:9), in clock_nanosleep"."""
        frames = self.main_frames()
        if not frames:
            return ""
        python = [f for f in frames if PYTHON_FRAME.search(f)]
        own = next((f for f in python if not any(p in f for p in PLUMBING)), python[0] if python else frames[0])
        named = [f for f in frames if not f.startswith("0x")]  # a bare address says nothing
        inner = (named or frames)[0].split(" (")[0]
        return short(own) if (named or frames)[0] == own else f"{short(own)}, in {inner}"


def short(frame: str) -> str:
    """`fn (/long/path/file.py:12)` as `fn (file.py:12)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')')).name})" if where else name


def process_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def parse_dump(text: str, pid: int = 0) -> list[tuple[str, str, list[str]]]:
    """(thread name, idle/active, frames innermost first) of each thread; an unnamed thread whose id is the
    pid is the main thread."""
    threads: list[tuple[str, str, list[str]]] = []
    for line in text.splitlines():
        if m := THREAD.match(line):
            name = m.group(3) or ("MainThread" if m.group(1) == str(pid) else f"thread {m.group(1)}")
            threads.append((name, m.group(2), []))
        elif threads and (m := FRAME.match(line)):
            threads[-1][2].append(f"{m.group(1)} ({m.group(2)})")
    return threads


def service_role(words: list[str]) -> str | None:
    """What a process of the run that is not in its process list is, by its command line (whole words,
    never a substring: `--use-mlflow` on a driver's command line is no MLflow UI):
    "delivery" (`python -m miles.tracking.cli`, `miles replay-spool`), "mlflow-ui" (`mlflow ui`,
    `mlflow server`), "driver" (`miles train`, `python -m flows.cli train`, `python -m flows.train_command`)."""
    names = [Path(w).name for w in words]
    for i, name in enumerate(names):
        following = names[i + 1] if i + 1 < len(names) else ""
        if name == "miles.tracking.cli" or (name == "miles" and following == "replay-spool"):
            return "delivery"
        if name == "mlflow" and following in ("ui", "server"):
            return "mlflow-ui"
        if (name in ("miles", "flows.cli") and following == "train") or name == "flows.train_command":
            return "driver"
    return None


def run_processes(run_dir: Path, listed: dict[str, int], ray_workers: dict[str, int]) -> dict[str, int]:
    """The run's processes: those it listed (trainer, ranks, engines, router), its Ray workers, and the
    live processes whose command line names the run dir and says what they are (`service_role`: the
    tracker delivery process, the MLflow UI, the `miles train` driver); a reader of the run dir (the
    dashboard, this command) is not one of them."""
    found = dict(listed)
    known = set(found.values())
    for name, pid in ray_workers.items():
        if pid not in known:
            found[name], known = pid, known | {pid}
    root = str(Path(run_dir).resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in known or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        role = service_role(words)
        if role and any(Path(w).is_absolute() and (w == root or w.startswith(root + "/")) for w in words):
            key, i = role, 1
            while key in found:
                key, i = f"{role}{i}", i + 1
            found[key] = int(entry.name)
    return found


def dump_stacks(processes: dict[str, int], out: Path) -> list[ProcessStack]:
    """A py-spy dump of every live process into out/<name>-<pid>.txt: with native frames where py-spy
    can, else Python frames only; a stopped process without pausing it. What failed is kept in words."""
    stacks = []
    for name, pid in processes.items():
        stack = ProcessStack(name, pid, process_state(pid))
        stacks.append(stack)
        if not stack.alive:
            stack.error = "not running"
            continue
        stopped = stack.state in ("T", "t")
        path = out / f"{name}-{pid}.txt"
        errors = []
        for native in (True, False):
            try:
                pyspy.dump(pid, path, native=native, nonblocking=stopped)
                stack.dump = path.read_text()
                break
            except pyspy.PySpyUnavailable as exc:
                errors.append(str(exc))
                break  # no ptrace (or no py-spy): the same without --native
            except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
                errors.append(str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__)
        if not stack.dump:
            stack.error = "; ".join(errors)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"no stack of {name} (pid {pid}, {stack.state_words}): {stack.error}\n")
        stack.threads = parse_dump(stack.dump, pid)
    return stacks
