"""One httpx client per process for the control plane: the driver's calls to the router and the engines
(weight pushes, pause/continue, weight versions, router stats, health probes, profiler windows).

`httpx.post(...)` builds a new client per call, and each new client loads the CA bundle into a fresh SSL
context, even for a loopback http:// URL that never uses TLS: 5-10 ms of CPU per call. A step makes
about ten such calls; in an async run (rollout and training overlapped on two cores) py-spy found the
driver's main thread spending 40% of its samples there. One client made once, with its connections kept
alive, costs that once. Each call passes its own timeout. httpx's Client is safe to share between threads.
"""
from __future__ import annotations

import os
import threading

import httpx

_lock = threading.Lock()
_client: httpx.Client | None = None
_owner_pid: int | None = None


def control_client() -> httpx.Client:
    """This process's client (a forked child makes its own: connections are not shared across a fork)."""
    global _client, _owner_pid
    with _lock:
        if _client is None or _owner_pid != os.getpid():
            _client, _owner_pid = httpx.Client(timeout=30.0), os.getpid()
        return _client
