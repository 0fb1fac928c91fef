"""Test hook behind `--inject-fault abort-engine[:N]@ITER`: an abort storm on one engine.

The engine is paused (its queue holds what arrives) and every request that queues is aborted, until
`count` were aborted or `timeout` passed; then generation continues. Pausing first makes the storm exact
however fast the machine is: no request of the rollout is decoded before its abort, so the rollout's
aborted share does not depend on timing (the tiny rollouts end before a poll could catch one running).
"""
from __future__ import annotations

import threading
import time

import httpx

from miles.serving.auth import bearer

POLL_S = 0.02


class AbortStorm:
    """Pauses the engine at once and aborts every request that queues on a daemon thread, until `count`
    were aborted, `timeout` passed or `stop()`; then generation continues."""

    def __init__(self, engine_url: str, count: int, token: str | None = None, timeout: float = 120.0):
        headers = bearer(token)
        self.client = httpx.Client(base_url=engine_url, headers=headers, timeout=30.0)
        self.count, self.aborted = count, 0
        self.deadline = time.monotonic() + timeout
        self._stop = threading.Event()
        self.client.post("/pause_generation").raise_for_status()  # before returning: requests will queue
        self.thread = threading.Thread(target=self._run, daemon=True, name="miles-abort-storm")
        self.thread.start()

    def _run(self) -> None:
        try:
            while self.aborted < self.count and time.monotonic() < self.deadline and not self._stop.is_set():
                if self.client.get("/get_server_info").json()["num_queue_reqs"]:
                    self.aborted += int(self.client.post("/abort_request", json={"abort_all": True}).json()["aborted"])
                else:
                    self._stop.wait(POLL_S)
        finally:
            self.client.post("/continue_generation")
            self.client.close()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=60)
