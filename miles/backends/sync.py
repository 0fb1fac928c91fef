"""Weight sync from the training ranks to every engine, with a new weight version (Miles' "p2p").

Across processes the ranks write an HF checkpoint directory and each engine loads it
(`/update_weights_from_disk`); co-located, rank 0's full state dict is pushed in memory.
The router is told the new version so it can report which weights serve traffic.
"""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from miles.backends.group import ActorGroup


class WeightSyncError(RuntimeError):
    """An engine or the router did not accept new weights."""


def _engine_weights():
    from miles.engines import weights  # imported late: the engine side is optional for the backend

    return weights


def push_disk(engine_urls: list[str], model_dir: Path, version: int, token: str | None = None) -> None:
    weights = _engine_weights()
    with ThreadPoolExecutor(max_workers=max(1, len(engine_urls))) as pool:
        list(pool.map(lambda url: weights.push_weights_from_disk(url, str(model_dir), str(version), token=token),
                      engine_urls))


def tell_router(router_url: str | None, version: int, admin_token: str | None = None) -> None:
    if router_url is None:
        return
    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    response = httpx.post(f"{router_url}/update_weight_version", json={"weight_version": str(version)},
                          headers=headers, timeout=60)
    if response.status_code != 200:
        raise WeightSyncError(f"router {router_url} refused weight version {version}: "
                              f"{response.status_code} {response.text[:200]}")


class WeightSync:
    """Pushes the ranks' current weights to the engines; keeps only the newest exported directory."""

    def __init__(self, group: ActorGroup, engine_urls: list[str], router_url: str | None, export_root: Path,
                 in_memory: bool, admin_token: str | None = None):
        self.group, self.engine_urls, self.router_url = group, engine_urls, router_url
        self.admin_token = admin_token
        self.export_root, self.in_memory = export_root, in_memory

    def push(self, version: int) -> None:
        if self.in_memory:
            state = self.group.call("export_weights", None)[0]
            weights = _engine_weights()
            for url in self.engine_urls:
                weights.push_weights_in_memory(url, state, str(version), token=self.admin_token)
        else:
            target = self.export_root / f"v{version:06d}"
            self.group.call("export_weights", str(target))
            push_disk(self.engine_urls, target, version, self.admin_token)
            for old in self.export_root.glob("v*"):
                if old != target:
                    shutil.rmtree(old, ignore_errors=True)
        self.group.call("set_weight_version", version)
        tell_router(self.router_url, version, self.admin_token)


def served_version(engine_url: str, probe_ids: list[int]) -> str | None:
    """The weight version an engine serves now, read off a one-token generation."""
    payload = {"input_ids": probe_ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    response = httpx.post(f"{engine_url}/generate", json=payload, timeout=120)
    if response.status_code != 200:
        raise WeightSyncError(f"engine {engine_url} did not answer a probe: {response.status_code}")
    version = (response.json().get("meta_info") or {}).get("weight_version")
    return None if version is None else str(version)
