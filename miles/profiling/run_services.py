"""Where a run's services are (RUN_DIR/profiler/services.json): its Ray cluster (GCS address, dashboard URL,
job id), the engines' and the router's URLs; written by the trainer at start, read by `miles diagnose`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ray

from miles.record import layout
from miles.record.files import write_atomic


def ray_facts() -> dict[str, Any]:
    """The connected Ray cluster as a reader in another process finds it; {} when Ray is not connected."""
    if not ray.is_initialized():
        return {}
    from ray._private.worker import get_dashboard_url

    context = ray.get_runtime_context()
    dashboard = get_dashboard_url() or ""
    return {"gcs_address": context.gcs_address, "job_id": context.get_job_id(),
            "dashboard_url": dashboard if "://" in dashboard or not dashboard else f"http://{dashboard}"}


def write_services(run_dir: Path, engine_urls: list[str], router_url: str | None) -> Path:
    return write_atomic(Path(run_dir) / layout.SERVICES, json.dumps(
        {"ray": ray_facts(), "engine_urls": list(engine_urls), "router_url": router_url}, indent=1))


def read_services(run_dir: Path) -> dict[str, Any]:
    """The services file, checked: {} when missing or not the shape written here (a hostile run dir)."""
    try:
        raw = json.loads((Path(run_dir) / layout.SERVICES).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    engines = raw.get("engine_urls")
    router = raw.get("router_url")
    facts = raw.get("ray") if isinstance(raw.get("ray"), dict) else {}
    return {"ray": {k: v for k, v in facts.items() if isinstance(v, str)},
            "engine_urls": [u for u in engines if isinstance(u, str)] if isinstance(engines, list) else [],
            "router_url": router if isinstance(router, str) else None}
