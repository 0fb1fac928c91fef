"""Fixtures of the security probes: one real embedded engine (with an admin token) and routers in front
of it, all on loopback."""
from __future__ import annotations

import httpx
import pytest

from miles.config import RouterConfig
from miles.config import EngineConfig
from miles.engines.launch import launch_engine
from miles.router import start_router

TOKEN = "probe-token"  # the engine and the routers share it, so an admin call through a router reaches the engine
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BATCH = 32


@pytest.fixture(scope="session")
def engine(base_model, tmp_path_factory):
    config = EngineConfig(engine_device="cpu", engine_max_batch_size=MAX_BATCH, engine_header_timeout=2)
    handle = launch_engine(base_model, config, log_path=tmp_path_factory.mktemp("engine") / "engine.log",
                           env={"MILES_ENGINE_ADMIN_TOKEN": TOKEN})
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def tiny_engine(base_model, tmp_path_factory):
    """An engine without a token and with the `tiny` tool-call parser: the /v1 probes (chat shapes, knobs)."""
    config = EngineConfig(engine_device="cpu", engine_max_batch_size=8, tool_call_parser="tiny")
    handle = launch_engine(base_model, config, log_path=tmp_path_factory.mktemp("tiny-engine") / "engine.log")
    yield handle
    handle.stop()


@pytest.fixture
def router(engine):
    """`router(token=TOKEN, **config)`: an in-process router in front of the engine; stopped at teardown."""
    handles = []

    def start(token: str | None = TOKEN, worker_urls=None, **fields):
        handle = start_router(RouterConfig(router_admin_token=token, **fields),
                              worker_urls=[engine.url] if worker_urls is None else worker_urls)
        handles.append(handle)
        return handle
    yield start
    for handle in handles:
        handle.stop()


def generate(url: str, text: str = "12+34=", max_new_tokens: int = 4, **params) -> httpx.Response:
    return httpx.post(url + "/generate", json={"text": text, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0.0, **params}}, timeout=120)
