"""Which live process holds a run's locks: the trainer's RUN_DIR/.lock and the delivery process's
tracking/delivery.lock, read from the kernel's lock table (/proc/locks), never by taking them.

The files name their holder, but a dead holder leaves its name behind and its pid may be reused; the
kernel drops an `flock` with its holder (even on SIGKILL), so a lock in the table is a live holder.
Taking the lock to test it would refuse a trainer starting in that instant. Only this host's locks
are in the table: elsewhere (another node, /proc/locks unreadable) the answer is None, "not known
here".
"""
from __future__ import annotations

import os
from pathlib import Path

PROC_LOCKS = Path("/proc/locks")


def _device_and_inode(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)  # a link planted at the name is not the run's
    except OSError:
        return None
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def lock_holder(path: Path, table: Path = PROC_LOCKS) -> int | None:
    """The pid holding a granted lock on `path` (None: none held here, or the table cannot be read).
    A line reads `1: FLOCK  ADVISORY  WRITE 4242 08:01:131 0 EOF` (device in hex major:minor, then
    the inode); a waiter's line has `->` after the number and holds nothing."""
    want = _device_and_inode(Path(path))
    if want is None:
        return None
    try:
        lines = table.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            found = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        if found == want and pid > 0:
            return pid
    return None
