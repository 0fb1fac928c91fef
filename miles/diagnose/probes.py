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


def ray_state(dashboard_url: str) -> dict[str, Any]:
    """The cluster's actors, tasks and workers from Ray's state API (the dashboard's HTTP API)."""
    from ray.util.state import list_actors, list_tasks, list_workers

    out: dict[str, Any] = {}
    for key, fn in (("actors", list_actors), ("tasks", list_tasks), ("workers", list_workers)):
        try:
            rows = fn(address=dashboard_url, limit=1000, timeout=RAY_TIMEOUT_S, detail=True,
                      raise_on_missing_output=False)
            out[key] = [json.loads(json.dumps(r.__dict__ if hasattr(r, "__dict__") else dict(r), default=str))
                        for r in rows]
        except Exception as exc:  # an unreachable dashboard: say so, keep the rest
            out[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return out


def ray_worker_pids(state: dict[str, Any]) -> dict[str, int]:
    """The live actors' processes, named by class (and name): the run's Ray workers."""
    found = {}
    actors = state.get("actors")
    for actor in actors if isinstance(actors, list) else []:
        pid, alive = actor.get("pid"), actor.get("state") == "ALIVE"
        if isinstance(pid, int) and pid > 0 and alive:
            label = actor.get("name") or actor.get("class_name") or "actor"
            found[f"ray-{label}".replace("/", "_").replace(" ", "_")[:60]] = pid
    return found


def save_timeline(run_dir: Path, gcs_address: str, path: Path) -> str:
    """The Ray timeline into `path`: with this process's Ray connection, else as a short-lived driver of
    the run's cluster. Returns "" or why not."""
    import ray

    from miles.profiling.ray_timeline import save_ray_timeline

    connected_here = False
    try:
        if not ray.is_initialized():
            ray.init(address=gcs_address, logging_level="ERROR", log_to_driver=False, namespace="miles-diagnose")
            connected_here = True
        save_ray_timeline(run_dir, path)
        return ""
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:500]
    finally:
        if connected_here:
            ray.shutdown()
