"""Services die with the process that started them, even when it was killed with SIGKILL.

The launcher puts its pid in MILES_PARENT_PID; the service calls `watch_parent()` at start-up.
A daemon thread then checks twice a second that its parent is still that pid (a killed parent's
children are re-parented to init or a subreaper) and, once it is not, stops the service with
SIGTERM, then exits hard if it has not gone after a grace period. A poll rather than
PR_SET_PDEATHSIG: that signal follows the parent *thread*, and services are started from
worker threads (Prefect tasks, Ray) that end long before the run does.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

PARENT_ENV = "MILES_PARENT_PID"
POLL_S = 0.5
GRACE_S = 10.0

log = logging.getLogger(__name__)


def parent_env() -> dict[str, str]:
    """What a launcher adds to a service's environment so the service can watch it."""
    return {PARENT_ENV: str(os.getpid())}


def watch_parent() -> threading.Thread | None:
    """Start the watch if this process was launched with MILES_PARENT_PID (else do nothing)."""
    expected = os.environ.get(PARENT_ENV)
    if not expected or not expected.isdigit():
        return None
    thread = threading.Thread(target=_watch, args=(int(expected),), name="miles-parent-watch", daemon=True)
    thread.start()
    return thread


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    log.warning("parent process %d is gone: shutting down", parent)
    print(f"miles: parent process {parent} is gone; shutting down", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(1)
