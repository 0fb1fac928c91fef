"""Real short runs (`python -m miles.train` in its own session) made to hang or die: start one, wait on it
(failing at once, with its output, if it ends first), read its pids, and clean up whatever it started."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.flags import HANGING
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
START_S = 240.0  # Ray, engine, router and the first rollouts on a loaded machine
SECRET_TOKEN = "diag-admin-token-7f3a9c"
SECRET_ENV_VALUE = "diag-env-secret-51d2e8"


class Run:
    def __init__(self, run_dir: Path, flags: list[str], hang_file: Path):
        self.run_dir, self.hang_file = run_dir, hang_file
        self.log = run_dir.parent / "stdout.log"
        env = dict(os.environ, MILES_TEST_HANG_FILE=str(hang_file), OMP_NUM_THREADS="1",
                   MILES_TEST_DIAG_TOKEN=SECRET_ENV_VALUE)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "miles.train", "--run-dir", str(run_dir), *HANGING, *flags],
                                         cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.stopped: list[int] = []  # pids this test sent SIGSTOP: resumed at teardown whatever happens

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def ended(self) -> str | None:
        """Why waiting on this run is pointless (it exited), or None while it runs."""
        return None if self.proc.poll() is None else f"the run ended (exit {self.proc.returncode})"

    def wait_for(self, predicate, timeout: float, what: str):
        """`wait_for` that fails at once if the run ends first, with the tail of its output."""
        return wait_for(predicate, timeout, what, interval=0.5, gone=self.ended, context=lambda: self.output()[-3000:])

    def processes(self) -> dict[str, int]:
        path = self.run_dir / "profiler" / "processes.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def sigstop(self, pid: int) -> None:
        self.stopped.append(pid)
        os.kill(pid, signal.SIGSTOP)

    def close(self) -> None:
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.hang_file.unlink(missing_ok=True)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the run's own session: the trainer and what it started
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pid in self.processes().values():  # services in sessions of their own, if any outlived it
            try:  # still ours (a pid reused since would not name miles in its command line)
                if b"miles" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
