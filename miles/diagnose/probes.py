"""What a run's services say now: each engine's /health and queue depths (/metrics), the router's
/list_workers, and Ray's view (`ray status`, the run's actors and tasks, the Ray timeline).

Every probe has a short timeout and answers in words when it gets none: a hung engine is the
finding, not a reason for diagnose to hang too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from miles.config.secrets import SECRET_ENV

PROBE_TIMEOUT_S = 3.0
QUEUE_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
RAY_TIMEOUT_S = 20


def _headers() -> dict[str, str]:
    token = os.environ.get(SECRET_ENV["router_admin_token"])
    return {"Authorization": f"Bearer {token}"} if token else {}


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
    probe = EngineProbe(index, url)
    try:
        httpx.get(f"{url}/health", headers=_headers(), timeout=PROBE_TIMEOUT_S).raise_for_status()
        probe.healthy = True
        probe.gauges = gauges_of(httpx.get(f"{url}/metrics", headers=_headers(), timeout=PROBE_TIMEOUT_S).text)
    except httpx.TimeoutException:
        probe.error = f"no answer in {PROBE_TIMEOUT_S:g} s"
    except httpx.HTTPError as exc:
        probe.error = type(exc).__name__ if probe.healthy is False else f"/metrics: {type(exc).__name__}"
    return probe


def probe_router(url: str | None) -> dict[str, Any]:
    if not url:
        return {"url": None, "error": "the run has no router"}
    try:
        answer = httpx.get(f"{url}/list_workers", headers=_headers(), timeout=PROBE_TIMEOUT_S)
        answer.raise_for_status()
        return {"url": url, "list_workers": answer.json()}
    except (httpx.HTTPError, ValueError) as exc:
        return {"url": url, "error": f"/list_workers: {type(exc).__name__}: {exc}"[:300]}


def ray_status(gcs_address: str) -> str:
    """`ray status` of the run's cluster, or why there is none."""
    command = [sys.executable, "-m", "ray.scripts.scripts", "status", "--address", gcs_address]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RAY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"ray status --address {gcs_address}: no answer in {RAY_TIMEOUT_S} s\n"
    return done.stdout + (f"\n(exit {done.returncode}) {done.stderr[-2000:]}" if done.returncode else "")


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


def ray_facts(run_dir: Path, gcs_address: str, dashboard_url: str | None, out: Path) -> tuple[dict, list[str]]:
    """Ray's view of the run into `out` (timeline.json, actors/tasks/workers.json), with this process's
    Ray connection, else as a short-lived driver of the run's cluster. Returns the state and notes."""
    import ray

    from miles.profiling.ray_timeline import save_ray_timeline

    notes, state = [], {}
    connected_here = False
    try:
        if not ray.is_initialized():
            ray.init(address=gcs_address, logging_level="ERROR", log_to_driver=False, namespace="miles-diagnose")
            connected_here = True
        try:
            save_ray_timeline(run_dir, out / "timeline.json")
        except Exception as exc:
            notes.append(f"no Ray timeline: {type(exc).__name__}: {exc}"[:500])
        state = ray_state(dashboard_url)
    except Exception as exc:
        notes.append(f"cannot connect to the run's Ray cluster at {gcs_address}: {type(exc).__name__}: {exc}"[:500])
    finally:
        if connected_here:
            ray.shutdown()
    for key, rows in state.items():
        (out / f"{key}.json").write_text(json.dumps(rows, indent=1, default=str))
    return state, notes
