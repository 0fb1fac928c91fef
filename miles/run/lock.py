"""One trainer per run directory: an exclusive `flock` on RUN_DIR/.lock, held for the whole run.

The kernel drops the lock when its holder dies (even by SIGKILL), so a stale lock from a dead
process is simply taken over; the file names the holder so a refused second trainer can say who.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from miles.config import ConfigError
from miles.record import layout

LOCK_NAME = layout.LOCK


class RunDirLock:
    """Holds RUN_DIR/.lock until `release()` (or the end of a `with` block)."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError("--run-dir", f"{run_dir} is in use by another trainer ({holder}); wait for it to end "
                                           f"or choose another --run-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunDirLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
