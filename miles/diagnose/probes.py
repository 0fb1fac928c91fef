"""What a run's services say now: each engine's /health and queue depths (/metrics), the router's
/list_workers, and Ray's state (the run's actors, tasks and workers; `ray_view` runs it bounded).

Every probe has a short timeout and answers in words when it gets none: a hung engine is the
finding, not a reason for diagnose to hang too.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import httpx

from miles.config.secrets import SECRET_ENV
from miles.diagnose.local_services import (held_by, http_host_port, is_miles_router, local_url_problem,
                                           process_environ)
from miles.serving.auth import bearer

PROBE_TIMEOUT_S = 3.0
QUEUE_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
RAY_TIMEOUT_S = 20


def admin_headers() -> dict[str, str]:
    """This shell's router admin token, for the router's admin /list_workers only: a caller checks first
    that the router is the run's own (`local_services`)."""
    return bearer(os.environ.get(SECRET_ENV["router_admin_token"]))


def _own_token(pid: int) -> dict[str, str]:
    """The admin token in a process's own environment (the run's router, checked to hold the port)."""
    return bearer(process_environ(pid).get(SECRET_ENV["router_admin_token"]))


@dataclass
class EngineProbe:
    index: int
    url: str
    healthy: bool = False
    error: str = ""
    gauges: dict[str, float] = field(default_factory=dict)

    @property
    def words(self) -> str:
        if not self.healthy:
            return f"engine {self.index} ({self.url}) not answering /health ({self.error})"
        depth = ", ".join(f"{k.split(':')[-1]}={v:g}" for k, v in self.gauges.items())
        return f"engine {self.index} alive ({depth or 'no queue gauges'})"


def gauges_of(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        name = name.split("{")[0]
        if name in QUEUE_GAUGES:
            try:
                out[name] = out.get(name, 0.0) + float(value.split()[0])
            except (ValueError, IndexError):
                continue
    return out


def probe_engine(index: int, url: str) -> EngineProbe:
    """/health and /metrics: open endpoints, asked without any token. Only a URL on this machine is asked."""
    probe = EngineProbe(index, url)
    problem = local_url_problem(url)
    if problem is not None:
        probe.error = problem
        return probe
    try:
        httpx.get(f"{url}/health", timeout=PROBE_TIMEOUT_S).raise_for_status()
        probe.healthy = True
        probe.gauges = gauges_of(httpx.get(f"{url}/metrics", timeout=PROBE_TIMEOUT_S).text)
    except httpx.TimeoutException:
        probe.error = f"no answer in {PROBE_TIMEOUT_S:g} s"
    except httpx.HTTPError as exc:
        probe.error = type(exc).__name__ if probe.healthy is False else f"/metrics: {type(exc).__name__}"
    return probe


def probe_router(url: str | None, run_pids: list[int] | None = None) -> dict[str, Any]:
    """The router's /list_workers (an admin endpoint): asked only on this machine, and with this shell's
    admin token only when a live process of the run's own list (`run_pids`) listens on the router's port
    and runs a miles router for it (a URL or pid a run dir names is not proof that the run's router is
    there)."""
    if not url:
        return {"url": None, "error": "the run has no router"}
    problem = local_url_problem(url)
    if problem is not None:
        return {"url": url, "error": problem}
    port = http_host_port(url)[1]
    holder = held_by(list(run_pids or []), port)
    router = holder if holder is not None and is_miles_router(holder, port) else None
    # the run's router: this shell's token, else the one the router itself was given (its own environment)
    headers = (admin_headers() or _own_token(router)) if router is not None else {}
    try:
        answer = httpx.get(f"{url}/list_workers", headers=headers, timeout=PROBE_TIMEOUT_S)
        if answer.status_code == 401 and router is None:
            why = "no process of the run's process list listens on this port" if holder is None else \
                f"the process listening on it (pid {holder}) is not a miles router"
            return {"url": url, "error": f"/list_workers: 401; no admin token sent: {why}"}
        answer.raise_for_status()
        return {"url": url, "list_workers": answer.json()}
    except (httpx.HTTPError, ValueError) as exc:
        return {"url": url, "error": f"/list_workers: {type(exc).__name__}: {exc}"[:300]}


def ray_state(dashboard_url: str | None) -> dict[str, Any]:
    """The cluster's actors, tasks and workers: from Ray's state API when the cluster has a dashboard,
    else from the GCS through this process's driver connection (`save_timeline` makes one)."""
    import ray

    out: dict[str, Any] = {}
    if dashboard_url:
        from ray.util.state import list_actors, list_tasks, list_workers

        sources = {"actors": lambda: list_actors(address=dashboard_url, limit=1000, timeout=RAY_TIMEOUT_S,
                                                 detail=True, raise_on_missing_output=False),
                   "tasks": lambda: list_tasks(address=dashboard_url, limit=1000, timeout=RAY_TIMEOUT_S,
                                               detail=True, raise_on_missing_output=False),
                   "workers": lambda: list_workers(address=dashboard_url, limit=1000, timeout=RAY_TIMEOUT_S,
                                                   detail=True, raise_on_missing_output=False)}
    elif ray.is_initialized():
        from ray._private.state import state

        sources = {"actors": lambda: list(state.actor_table(None).values()),
                   "tasks": lambda: state._get_all_task_events()[-1000:],
                   "workers": lambda: state.workers()}
    else:
        return {"error": "no Ray connection"}
    for key, fn in sources.items():
        try:
            rows = fn()
            out[key] = [_plain(r) for r in rows]
        except Exception as exc:  # an unreachable cluster: say so, keep the rest
            out[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return out


def _plain(row: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(row):
        row = dataclasses.asdict(row)
    elif hasattr(row, "items"):
        row = dict(row.items())
    return json.loads(json.dumps(row, default=str))


def ray_worker_pids(state: dict[str, Any]) -> dict[str, int]:
    """The live actors' processes, named by class (and name): the run's Ray workers."""
    found = {}
    actors = state.get("actors")
    for actor in actors if isinstance(actors, list) else []:
        pid = actor.get("pid", actor.get("Pid"))
        alive = str(actor.get("state", actor.get("State"))) in ("ALIVE", "2")  # the GCS table's enum: 2 is ALIVE
        if isinstance(pid, int) and pid > 0 and alive:
            label = actor.get("name") or actor.get("Name") or actor.get("class_name") or \
                actor.get("ActorClassName") or "actor"
            found[f"ray-{label}".replace("/", "_").replace(" ", "_")[:60]] = pid
    return found
