"""The one client of the router's admin API: register a worker, take it out of traffic or admit it,
announce a weight version, take the stats window. Every call carries the run's token (`auth.bearer`).

A change to the admin API (`miles/router/app.py`) touches this file and no caller. It lives in
serving/, below engines/ and router/, because the engine supervisor (on the router's own floor)
calls it too.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import httpx

from miles.serving.auth import bearer
from miles.serving.control_http import control_client

STATS_RETRY_S = 0.5  # between tries of /router_stats while a relaunched router comes back


class RouterError(RuntimeError):
    """The router answered an admin call with an error status; the message names the call and the answer."""


class RouterClient:
    """`RouterClient(url, token)`: the router at `url`, called with `token` (None: a router without one).
    Transport errors (the router is down) stay `httpx.HTTPError`; an error answer is a `RouterError`."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def add_worker(self, worker_url: str, ready: bool = True, version: int | str | None = None,
                   exist_ok: bool = False) -> None:
        """Register `worker_url`: in traffic (`ready`) or stale until admitted; `exist_ok`: already
        registered is fine (a retried registration)."""
        body: dict[str, Any] = {"url": worker_url, "state": "healthy" if ready else "stale"}
        if version is not None:
            body["weight_version"] = str(version)
        self._post("/add_worker", body, accept=(200, 409) if exist_ok else (200,))

    def mark_stale(self, worker_url: str) -> None:
        """Take `worker_url` out of traffic now."""
        self._post("/set_worker_state", {"url": worker_url, "state": "stale"})

    def admit(self, worker_url: str, version: int | str) -> None:
        """Put `worker_url` back in traffic; it serves weight `version` (the router refuses any other)."""
        self._post("/set_worker_state", {"url": worker_url, "state": "healthy", "weight_version": str(version)})

    def set_weight_version(self, version: int | str) -> None:
        """The weight version the router reports as serving traffic."""
        self._post("/update_weight_version", {"weight_version": str(version)})

    def take_stats(self, patience: float = 0.0, give_up: Callable[[], None] | None = None) -> dict[str, float]:
        """The router's numeric counters since they were last taken, which starts a new window (reading
        /router_stats resets them). A router that cannot be reached is waited for up to `patience`
        seconds (a supervised router being relaunched); `give_up`, asked after each failed try, raises
        to end the wait early (the supervisor gave up on the router)."""
        deadline = time.monotonic() + patience
        while True:
            try:
                response = control_client().get(f"{self.url}/router_stats", headers=bearer(self.token),
                                                timeout=self.timeout)
                break
            except httpx.TransportError:
                if give_up is not None:
                    give_up()
                if time.monotonic() >= deadline:
                    raise
                time.sleep(STATS_RETRY_S)  # bounded by the deadline; the router answers once relaunched
        stats = self._checked("/router_stats", response, (200,)).json()
        return {key: float(value) for key, value in stats.items()
                if isinstance(value, (int, float)) and not isinstance(value, bool)}

    def _post(self, path: str, body: dict, accept: tuple[int, ...] = (200,)) -> httpx.Response:
        response = control_client().post(self.url + path, json=body, headers=bearer(self.token), timeout=self.timeout)
        return self._checked(path, response, accept)

    def _checked(self, path: str, response: httpx.Response, accept: tuple[int, ...]) -> httpx.Response:
        if response.status_code not in accept:
            raise RouterError(f"router {self.url}{path} answered HTTP {response.status_code}: {response.text[:300]}")
        return response
